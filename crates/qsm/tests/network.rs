//! End-to-end tests of the real `qsm` binary as a server and as clients over real sockets:
//! TLS and the local socket, incremental backups, restores of every kind, two isolated
//! nodes, bad logins, malformed requests, cancellation, and SIGKILL of either side.
//!
//! The suite itself is `suite/network.rs`; `network_postgres.rs` runs it again with the
//! catalog on PostgreSQL, and `network_s3.rs` with the catalog on PostgreSQL and the pool on
//! S3.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Whether the servers of this run keep their catalog on PostgreSQL.
const POSTGRES: bool = false;
/// Whether their pool is in an S3 bucket (with a PostgreSQL catalog only).
const S3: bool = false;

include!("suite/network.rs");

/// Two servers with data directories of their own on one SQLite catalog and one pool: nothing
/// forbids it, so the second's container, written before its first commit, must survive a
/// reclamation by the first (its lease), and become an orphan only once the second is killed
/// and its lease lapsed. Without leases on SQLite, the first deleted it under the second.
#[test]
fn servers_sharing_a_sqlite_catalog_lease_their_containers_too() {
    let dir = TempDir::new().unwrap();
    let one = dir.path().join("srv1");
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&one).unwrap();
    fs::write(one.join("server.toml"), "lease_seconds = 6\n").unwrap();
    let first = ServerProc::start(&one, false);
    let two = dir.path().join("srv2");
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&two).unwrap();
    let shared = format!(
        "lease_seconds = 6\ncatalog = {:?}\npool = {:?}\n",
        one.join("catalog.db"),
        one.join("pool")
    );
    fs::write(two.join("server.toml"), shared).unwrap();
    let mut second = ServerProc::start(&two, false);
    register(&first, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "pw", "alpha-password");
    let src = dir.path().join("src");
    big_tree(&src, 40);
    leases_keep_a_writing_servers_container_until_they_lapse(
        &first,
        &mut second,
        &one.join("pool"),
        &pw,
        &src,
    );
}

/// A GET of `url` (`http://HOST:PORT/PATH`) over a plain TCP connection: its status line and
/// body.
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

/// A Prometheus started on a free loopback port over its own storage, killed when dropped.
struct Prometheus {
    child: Child,
    url: String,
}

impl Prometheus {
    /// Scrapes `target` (`HOST:PORT`, path /metrics) every second.
    fn start(dir: &Path, target: &str) -> Prometheus {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/ensure-prometheus.sh");
        let status = StdCommand::new("bash").arg(script).status().unwrap();
        assert!(status.success(), "{script} failed: no Prometheus for the metrics tests");
        let config = dir.join("prometheus.yml");
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: qsm\n    \
                 static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = StdCommand::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Prometheus { child, url: format!("http://127.0.0.1:{port}") }
    }

    /// The value of the instant query `q` for the series whose labels include `want`, once
    /// Prometheus has scraped it.
    fn value(&self, q: &str, want: &[(&str, &str)]) -> Option<f64> {
        let url = format!("{}/api/v1/query?query={q}", self.url);
        let (status, body) = std::panic::catch_unwind(|| http_get(&url)).ok()?;
        if !status.contains(" 200 ") {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let series = v["data"]["result"]
            .as_array()?
            .iter()
            .find(|s| want.iter().all(|(k, val)| s["metric"][*k] == *val))?;
        series["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 26: `qsm server --metrics-listen` serves what a monitoring system needs in the text
/// format Prometheus scrapes, `promtool check metrics` finds nothing wrong with it, and a real
/// Prometheus scraping it reads each filespace's last backup time back through its query API.
#[test]
fn prometheus_scrapes_the_last_backup_of_each_filespace() {
    let dir = TempDir::new().unwrap();
    let server = ServerProc::start_with(
        &dir.path().join("srv"),
        false,
        &["--metrics-listen", "127.0.0.1:0"],
    );
    let metrics = server.metrics.clone().unwrap();
    register(&server, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "alpha", "alpha-password");
    let src = dir.path().join("src");
    big_tree(&src, 3);
    client(&server, "alpha", &pw).arg("backup").arg(&src).assert().success();
    // A wrong password is counted.
    let wrong = password_file(dir.path(), "wrong", "not-the-password");
    client(&server, "alpha", &wrong).args(["query", "filespace"]).assert().failure();
    let list = json(client(&server, "alpha", &pw).args(["query", "filespace"]));
    let ended = list[0]["last_completed"]["ended"].as_i64().unwrap();
    let filespace = src.canonicalize().unwrap().display().to_string();

    let (status, text) = http_get(&metrics);
    assert!(status.contains(" 200 "), "{status}");
    let series = format!(
        "qsm_filespace_last_backup_timestamp_seconds{{node=\"alpha\",filespace=\"{filespace}\"}} {ended}"
    );
    assert!(text.contains(&series), "no {series} in\n{text}");
    for line in [
        "qsm_server_logins_total{server=",
        "qsm_pool_size_bytes{pool=",
        "qsm_filespace_last_run_failed{node=\"alpha\"",
        "qsm_server_backups_total{",
        "qsm_catalog_size_bytes ",
    ] {
        assert!(text.contains(line), "no {line} in\n{text}");
    }
    assert!(
        text.lines().any(|l| l.starts_with("qsm_server_logins_total{")
            && l.contains("result=\"failed\"")
            && l.ends_with(" 1")),
        "the wrong password is not counted:\n{text}"
    );
    let mut check = StdCommand::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("promtool: {e} (scripts/ensure-prometheus.sh installs it)"));
    std::io::Write::write_all(&mut check.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let target = metrics.strip_prefix("http://").unwrap().trim_end_matches("/metrics");
    let prometheus = Prometheus::start(dir.path(), target);
    let want = [("node", "alpha"), ("filespace", filespace.as_str())];
    let mut seen = None;
    wait_for("Prometheus to scrape the last backup time", || {
        seen = prometheus.value("qsm_filespace_last_backup_timestamp_seconds", &want);
        seen.is_some()
    });
    assert_eq!(seen, Some(ended as f64));
}
