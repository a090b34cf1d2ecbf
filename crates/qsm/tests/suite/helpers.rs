// The helpers of the end-to-end network tests: servers, clients, trees, waits. Included by
// `suite/network.rs` (the tests every backend runs) and by `network_postgres.rs` (which runs
// only its own: the suite's run on PostgreSQL is `network_s3.rs`'s, PostgreSQL and S3 both).

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use predicates::prelude::*;
use tempfile::TempDir;

/// Sends `ops` as one Backup stream on the raw gRPC client `node` and reads the replies to
/// the end: `Ok` if the server accepted them all, else its first error. A macro because the
/// client's type (its interceptor closure) cannot be named.
macro_rules! backup_ops {
    ($node:expr, $ops:expr) => {
        async {
            let ops = $ops.into_iter().map(|op| v1::BackupOp { op: Some(op) }).collect();
            let request = tokio_stream::iter(vec![v1::BackupRequest { ops }]);
            let mut replies = $node.backup(request).await?.into_inner();
            while replies.message().await?.is_some() {}
            Ok::<(), tonic::Status>(())
        }
        .await
    };
}

/// A `qsm server` process on a free port, killed when dropped.
struct ServerProc {
    child: Child,
    data: PathBuf,
    url: String,
    /// Where it serves metrics, when started with `--metrics-listen` (network.rs's test
    /// does; the PostgreSQL and S3 run of the suite does not).
    #[allow(dead_code)]
    metrics: Option<String>,
    /// Where it serves the web console, when started with `--http-listen` (console.rs).
    #[allow(dead_code)]
    console: Option<String>,
}

impl ServerProc {
    fn start(data: &Path, tls: bool) -> ServerProc {
        ServerProc::start_with(data, tls, &[])
    }

    fn start_with(data: &Path, tls: bool, extra: &[&str]) -> ServerProc {
        backend(data);
        let mut cmd = StdCommand::new(assert_cmd::cargo::cargo_bin("qsm"));
        cmd.arg("server").arg("--data-dir").arg(data).arg("--listen").arg("127.0.0.1:0");
        cmd.args(extra);
        if !tls {
            cmd.arg("--plaintext");
        }
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("the server printed nothing").unwrap();
        let url = first.rsplit(' ').next().unwrap().to_owned();
        assert!(url.starts_with(if tls { "https://" } else { "http://" }), "{first}");
        let (mut metrics, mut console) = (None, None);
        while (extra.contains(&"--metrics-listen") && metrics.is_none())
            || (extra.contains(&"--http-listen") && console.is_none())
        {
            let line = lines.next().expect("the server did not say where it listens").unwrap();
            if let Some(url) = line.strip_prefix("qsm server: metrics on ") {
                metrics = Some(url.to_owned());
            }
            if let Some(url) = line.strip_prefix("qsm server: web console and API on ") {
                console = Some(url.to_owned());
            }
        }
        // Keep draining stdout so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        ServerProc { child, data: data.to_path_buf(), url, metrics, console }
    }

    fn socket(&self) -> String {
        format!("unix:{}", self.data.join("qsm.sock").display())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Gives a new data directory the backends of this run, in `DATA_DIR/server.toml`, which
/// every `qsm server --data-dir` command then reads (the server, `restore-db`, a second
/// server): with [`POSTGRES`], a throw-away PostgreSQL database as the catalog; with [`S3`],
/// also a pool in a bucket of an S3 server started for this data directory (its objects in
/// the sibling directory `DATA_DIR-s3`).
fn backend(data: &Path) {
    static DATABASES: std::sync::Mutex<Vec<qsm_catalog::testing::TempDatabase>> =
        std::sync::Mutex::new(Vec::new());
    if !POSTGRES || data.join("server.toml").exists() {
        return;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data)
        .unwrap();
    let db = qsm_catalog::testing::TempDatabase::new().unwrap();
    let mut settings = format!("catalog = {:?}\n", db.url);
    if S3 {
        let s3 = s3_server(data);
        s3.create_bucket(S3_BUCKET).unwrap();
        settings.push_str(&s3_settings(&s3.pool_config(S3_BUCKET, S3_PREFIX)));
    }
    fs::write(data.join("server.toml"), settings).unwrap();
    DATABASES.lock().unwrap().push(db);
}

/// The `[s3]` table of a `server.toml` for the pool `config`.
fn s3_settings(config: &qsm_pool_s3::S3PoolConfig) -> String {
    format!("[s3]\n{}", toml::to_string(config).unwrap())
}

/// Runs `qsm server --data-dir DATA`, which must refuse to start, and returns what it said.
fn server_refusal(data: &Path) -> String {
    let out = StdCommand::new(assert_cmd::cargo::cargo_bin("qsm"))
        .arg("server")
        .arg("--data-dir")
        .arg(data)
        .args(["--listen", "127.0.0.1:0", "--plaintext"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the server in {} started", data.display());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The bucket and key prefix of the S3 pools of this run.
const S3_BUCKET: &str = "backups";
const S3_PREFIX: &str = "qsm";

/// The S3 server of the data directory `data`, started on first use; it runs until the test
/// process ends, its objects in `DATA_DIR-s3` (removed with the test's directory).
fn s3_server(data: &Path) -> std::sync::Arc<qsm_pool_s3::test_server::TestServer> {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    static SERVERS: Mutex<BTreeMap<PathBuf, Arc<qsm_pool_s3::test_server::TestServer>>> =
        Mutex::new(BTreeMap::new());
    SERVERS
        .lock()
        .unwrap()
        .entry(data.to_path_buf())
        .or_insert_with(|| {
            let mut root = data.as_os_str().to_owned();
            root.push("-s3");
            fs::create_dir_all(&root).unwrap();
            Arc::new(
                qsm_pool_s3::test_server::TestServer::start(
                    root,
                    "127.0.0.1:0".parse().unwrap(),
                    "qsm-suite-key",
                    "qsm-suite-secret",
                )
                .unwrap(),
            )
        })
        .clone()
}

/// The file holding container `id` of `server`'s pool: in its pool directory, or the S3
/// server's object.
fn container_file(server: &ServerProc, id: u64) -> PathBuf {
    let name = format!("{id:016x}");
    if S3 {
        s3_server(&server.data).object_file(S3_BUCKET, &format!("{S3_PREFIX}/containers/{name}"))
    } else {
        server.data.join("pool/containers").join(&name[..2]).join(format!("{name}.qsmc"))
    }
}

/// Every container file of `server`'s pool, with its length.
/// Flips 16 bytes in the middle of the server's biggest container.
fn damage_the_biggest_container(server: &ServerProc) {
    let mut containers = container_files(server);
    containers.sort();
    let (len, victim) = containers.last().unwrap().clone();
    let mut bytes = fs::read(&victim).unwrap();
    let at = (len / 2) as usize;
    for b in &mut bytes[at..at + 16] {
        *b ^= 0x5a;
    }
    fs::write(&victim, bytes).unwrap();
}

fn container_files(server: &ServerProc) -> Vec<(u64, PathBuf)> {
    let top = if S3 {
        s3_server(&server.data).object_file(S3_BUCKET, &format!("{S3_PREFIX}/containers"))
    } else {
        server.data.join("pool/containers")
    };
    let mut found = Vec::new();
    let mut stack = vec![top];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(d).unwrap().filter_map(|e| e.ok()) {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                found.push((e.metadata().unwrap().len(), p));
            }
        }
    }
    assert!(!found.is_empty(), "no containers in {}'s pool", server.data.display());
    found
}

/// The catalog of `server`, opened directly (whichever backend it is on).
fn open_catalog(server: &ServerProc) -> qsm_catalog::AnyCatalog {
    match fs::read_to_string(server.data.join("server.toml")) {
        Ok(text) => {
            let url = text.split('"').nth(1).unwrap().to_owned();
            qsm_catalog::AnyCatalog::open(&url).unwrap()
        }
        Err(_) => qsm_catalog::AnyCatalog::open(
            server.data.join("catalog.db").to_str().unwrap(),
        )
        .unwrap(),
    }
}

fn admin(server: &ServerProc) -> Command {
    let mut c = Command::cargo_bin("qsm").unwrap();
    c.arg("admin").arg("--server").arg(server.socket());
    c
}

fn register(server: &ServerProc, node: &str, password: &str) {
    admin(server)
        .args(["register-node", node])
        .write_stdin(format!("{password}\n"))
        .assert()
        .success();
}

fn password_file(dir: &Path, name: &str, password: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, format!("{password}\n")).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// A client command for `node`, configured through the environment as a user would.
fn client(server: &ServerProc, node: &str, pw: &Path) -> Command {
    let mut c = Command::cargo_bin("qsm").unwrap();
    c.env("QSM_SERVER", &server.url)
        .env("QSM_NODE", node)
        .env("QSM_PASSWORD_FILE", pw)
        .env("QSM_CA", server.data.join("tls/cert.pem"))
        .env("QSM_HOME", "/nonexistent/embedded-must-not-be-used")
        .env("HOME", server.data.parent().unwrap());
    c
}

include!("noise.rs");
include!("daemon.rs");
include!("fidelity.rs");

fn tree(root: &Path) {
    fs::create_dir_all(root.join("docs/deep")).unwrap();
    fs::write(root.join("docs/a.txt"), b"alpha\n".repeat(1000)).unwrap();
    let data: Vec<u8> =
        (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    fs::write(root.join("docs/deep/b.bin"), data).unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    std::os::unix::fs::symlink("docs/a.txt", root.join("link")).unwrap();
}

/// Restores `src` as `node` through `server` into `to`, and checks that it came back
/// identical.
fn restores_intact(server: &ServerProc, node: &str, pw: &Path, src: &Path, to: &Path) {
    let report = json(client(server, node, pw).arg("restore").arg(src).arg("--to").arg(to));
    // The summary says how fast it went (issue 24), consistently with what it counts.
    let seconds = report["seconds"].as_f64().unwrap();
    let entries = report["entries_per_second"].as_f64().unwrap() * seconds;
    let bytes = report["bytes_per_second"].as_f64().unwrap() * seconds;
    assert!(seconds > 0.0, "{report}");
    assert!((entries - report["restored"].as_f64().unwrap()).abs() < 0.5, "{report}");
    assert!((bytes - report["bytes"].as_f64().unwrap()).abs() < 1.0, "{report}");
    assert_same(src, to);
}

fn assert_same(a: &Path, b: &Path) {
    let out =
        StdCommand::new("diff").arg("-r").arg("--no-dereference").arg(a).arg(b).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

fn json(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn qsm_time_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A tree big enough that a backup limited to 4 MB/s runs for seconds.
fn big_tree(root: &Path, files: usize) {
    fs::create_dir_all(root).unwrap();
    for i in 0..files {
        let data: Vec<u8> = (0..1_000_000u32)
            .map(|j| ((j as usize).wrapping_mul(2_654_435_761).wrapping_add(i * 7919) >> 11) as u8)
            .collect();
        fs::write(root.join(format!("f{i:03}")), data).unwrap();
    }
}

/// A backup of `src` by node alpha through the servers `urls`, slowed down and committing
/// every 3 files, so that a server can be killed in its middle; its report goes to stdout.
fn slow_backup(urls: &str, pw: &Path, src: &Path, home: &Path) -> Child {
    StdCommand::new(assert_cmd::cargo::cargo_bin("qsm"))
        .env("QSM_SERVER", urls)
        .env("QSM_NODE", "alpha")
        .env("QSM_PASSWORD_FILE", pw)
        .env("QSM_HOME", "/nonexistent/embedded-must-not-be-used")
        .env("HOME", home)
        .args(["backup", "--json", "--compression", "off", "--limit-upload", "4MB"])
        .args(["--txn-group-max", "3"])
        .arg(src)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn committed_objects(server: &ServerProc, node: &str, pw: &Path) -> usize {
    let out = client(server, node, pw).args(["query", "backup", "--json"]).output().unwrap();
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .map(|v| v.as_array().map_or(0, Vec::len))
        .unwrap_or(0)
}

/// An administrator over TCP (not the local socket, which is the server's own user).
fn admin_as(server: &ServerProc, name: &str, pw: &Path) -> Command {
    let mut c = Command::cargo_bin("qsm").unwrap();
    c.args(["admin", "--server", &server.url, "--admin", name, "--password-file"]).arg(pw);
    c
}

fn backed_up(report: &serde_json::Value) -> u64 {
    let first = report.as_array().map_or(report, |a| &a[0]);
    first["backed_up"].as_u64().unwrap()
}

/// The node sessions the server lists (administrators' left out).
fn node_sessions(server: &ServerProc) -> Vec<serde_json::Value> {
    let all = json(admin(server).args(["query", "session"]));
    all.as_array().unwrap().iter().filter(|s| s["admin"] == false).cloned().collect()
}

include!("issue32.rs");

/// A server with node "alpha", and its client (HOME is the test's directory).
fn issue32_server(dir: &Path) -> (ServerProc, PathBuf) {
    let server = ServerProc::start(&dir.join("srv"), false);
    register(&server, "alpha", "alpha-password");
    let pw = password_file(dir, "pa", "alpha-password");
    (server, pw)
}

/// A `qsm journal start` daemon watching `root` into `journal`, killed when dropped.
struct Issue32Daemon(Child);

impl Issue32Daemon {
    fn start(journal: &Path, root: &Path) -> Issue32Daemon {
        let mut child = StdCommand::new(assert_cmd::cargo::cargo_bin("qsm"))
            .args(["journal", "start", "--journal"])
            .arg(journal)
            .arg(root)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("the daemon printed nothing").unwrap();
        assert!(first.contains("watching"), "{first}");
        std::thread::spawn(move || for _ in lines {});
        Issue32Daemon(child)
    }
}

impl Drop for Issue32Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The second half of the shared-catalog tests (issue 23.7): `second` writes a container whose
/// first transaction takes seconds, so the catalog does not know it yet; `first` must keep it
/// (leased) while `second` lives and just after it is killed, and remove it as an orphan once
/// the lease (6 s, set by the caller) lapsed.
/// Not used by the S3 run: its pool is not a directory to watch.
#[allow(dead_code)]
fn leases_keep_a_writing_servers_container_until_they_lapse(
    first: &ServerProc,
    second: &mut ServerProc,
    pool: &Path,
    pw: &Path,
    src: &Path,
) {
    let containers = || -> Vec<PathBuf> {
        let mut all = Vec::new();
        for sub in fs::read_dir(pool.join("containers")).into_iter().flatten().flatten() {
            for f in fs::read_dir(sub.path()).into_iter().flatten().flatten() {
                all.push(f.path());
            }
        }
        all
    };
    let before = containers();
    let mut backup = StdCommand::new(assert_cmd::cargo::cargo_bin("qsm"))
        .env("QSM_SERVER", &second.url)
        .env("QSM_NODE", "alpha")
        .env("QSM_PASSWORD_FILE", pw)
        .env("QSM_HOME", "/nonexistent/embedded-must-not-be-used")
        .env("HOME", pool)
        .args(["backup", "--json", "--compression", "off", "--limit-upload", "2MB"])
        .args(["--txn-group-max", "1000"])
        .arg(src)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut fresh = Vec::new();
    wait_for("a new container", || {
        fresh = containers().into_iter().filter(|c| !before.contains(c)).collect();
        fresh.iter().any(|c| fs::metadata(c).map(|m| m.len() > 1_000_000).unwrap_or(false))
    });
    let reclaimed = json(admin(first).args(["reclaim", "stgpool"]));
    assert_eq!(reclaimed["orphans"], 0, "a leased container removed: {reclaimed}");
    second.kill();
    let _ = backup.wait();
    let reclaimed = json(admin(first).args(["reclaim", "stgpool"]));
    assert_eq!(reclaimed["orphans"], 0, "removed before its lease lapsed: {reclaimed}");
    assert!(fresh.iter().all(|c| c.exists()), "{fresh:?}");
    // The lease (6 s) lapses and a heartbeat of the first server (every 3 s) notices.
    std::thread::sleep(Duration::from_secs(10));
    let reclaimed = json(admin(first).args(["reclaim", "stgpool"]));
    assert!(reclaimed["orphans"].as_u64().unwrap() >= 1, "{reclaimed}");
    assert!(fresh.iter().all(|c| !c.exists()), "the crashed server's container is still there");
    let log = json(admin(first).args(["query", "actlog"]));
    assert!(log.to_string().contains("stopped answering"), "{log}");
}

/// A GET of `url` (`http://HOST:PORT/PATH`) over a plain TCP connection: its status line and
/// body.
#[allow(dead_code)] // not every binary that includes the helpers scrapes
fn http_get(url: &str) -> (String, String) {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut tcp = std::net::TcpStream::connect(host).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(tcp, "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.lines().next().unwrap().to_owned();
    // Chunked bodies are unchunked: sizes in hex, each on a line of its own.
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&after[..n]);
            rest = &after[n + 2..];
        }
        out
    } else {
        body.to_owned()
    };
    (status, body)
}
