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
        "qsm_server_request_duration_seconds_bucket{server=",
        "qsm_events_last_day{state=\"missed\"} 0",
    ] {
        assert!(text.contains(line), "no {line} in\n{text}");
    }
    assert!(
        text.lines().any(|l| l.starts_with("qsm_server_logins_total{")
            && l.contains("result=\"failed\"")
            && l.ends_with(" 1")),
        "the wrong password is not counted:\n{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("qsm_server_request_duration_seconds_count{")
            && l.contains("method=\"Login\"")),
        "no latency of the logins:\n{text}"
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

/// A webhook receiver on loopback: it refuses the first request (500), to make the server
/// retry, and keeps the JSON body of every request it takes.
struct Webhook {
    url: String,
    bodies: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl Webhook {
    fn start() -> Webhook {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&bodies);
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().enumerate() {
                let Ok(mut stream) = stream else { continue };
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // Headers, then as many body bytes as Content-Length says.
                let body = loop {
                    let Ok(k) = stream.read(&mut buf) else { break None };
                    if k == 0 {
                        break None;
                    }
                    request.extend_from_slice(&buf[..k]);
                    let text = String::from_utf8_lossy(&request).into_owned();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let length = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse().ok())?
                            })
                            .unwrap_or(0usize);
                        if body.len() >= length {
                            break Some(body[..length].to_owned());
                        }
                    }
                };
                let status = if n == 0 { "500 Internal Server Error" } else { "200 OK" };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                if n > 0
                    && let Some(v) = body.and_then(|b| serde_json::from_str(&b).ok())
                {
                    kept.lock().unwrap().push(v);
                }
            }
        });
        Webhook { url, bodies }
    }

    /// The alerts taken of `event`.
    fn got(&self, event: &str) -> Vec<serde_json::Value> {
        self.bodies.lock().unwrap().iter().filter(|b| b["event"] == event).cloned().collect()
    }
}

/// Issue 26: a webhook hears of a failed backup (a client killed mid-way), of the damaged
/// chunks an audit finds, and of a pool's file system past `pool_full_percent`, as JSON; a
/// refused delivery is retried, and every delivery is in the activity log.
#[test]
fn webhooks_hear_of_failed_backups_damaged_chunks_and_a_full_pool() {
    let dir = TempDir::new().unwrap();
    let hook = Webhook::start();
    let data = dir.path().join("srv");
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&data).unwrap();
    // Any file system holding the pool is more than 1% full.
    let settings = format!("pool_full_percent = 1\n[[alert]]\nurl = \"{}\"\n", hook.url);
    fs::write(data.join("server.toml"), settings).unwrap();
    let server = ServerProc::start(&data, false);
    wait_for("the pool-full alert", || !hook.got("pool-full").is_empty());
    let full = &hook.got("pool-full")[0];
    assert!(full["message"].as_str().unwrap().contains("% full"), "{full}");
    assert!(full["pool"].as_str().unwrap().ends_with("pool"), "{full}");
    assert!(full["time"].as_i64().unwrap() > 0 && full["server"].is_string(), "{full}");
    let log = json(admin(&server).args(["query", "actlog", "--search", "alert pool-full sent"]));
    let said = log[0]["message"].as_str().unwrap_or_default();
    assert!(said.contains("(attempt 2)"), "the refused first attempt was retried: {log:#}");
    assert!(!said.contains("/hook"), "the webhook's path (its secret, often) is logged: {said}");

    register(&server, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "pw", "alpha-password");
    let src = dir.path().join("src");
    big_tree(&src, 30);
    let mut killed = slow_backup(&server.url, &pw, &src, dir.path());
    wait_for("the slow backup to commit", || committed_objects(&server, "alpha", &pw) > 3);
    killed.kill().unwrap();
    killed.wait().unwrap();
    wait_for("the failed-backup alert", || !hook.got("failed").is_empty());
    let failed = &hook.got("failed")[0];
    assert_eq!(failed["node"], "alpha", "{failed}");
    assert_eq!(failed["filespace"], src.canonicalize().unwrap().display().to_string(), "{failed}");
    assert!(failed["message"].as_str().unwrap().contains("failed"), "{failed}");

    damage_the_biggest_container(&server);
    admin(&server).args(["audit", "stgpool"]).assert().code(4);
    wait_for("the damaged alert", || !hook.got("damaged").is_empty());
    let damaged = &hook.got("damaged")[0];
    assert!(damaged["message"].as_str().unwrap().contains("damaged chunks"), "{damaged}");
    assert_eq!(hook.got("pool-full").len(), 1, "the full pool was said once");
}

/// Issue 26: a schedule of a server action runs by itself in each of its windows, once, and
/// is an event with its result; a window that closed while the server was down is recorded
/// missed; each schedule's next window is a future event; a client action is refused (no
/// client scheduler yet), and deleting a schedule takes its events.
#[test]
fn server_schedules_run_in_their_windows_and_missed_windows_are_recorded() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("srv");
    let mut server = ServerProc::start(&data, false);
    register(&server, "alpha", "alpha-password");
    let now = qsm_time_now();
    let define = |server: &ServerProc, name: &str, args: &[&str]| {
        admin(server).args(["define", "schedule", "standard", name]).args(args).assert().success();
    };
    // Windows of 3 s every 4 s, from now: expiration runs in each.
    define(
        &server,
        "expire",
        &[
            "--action",
            "expire",
            "--start",
            &format!("@{now}"),
            "--duration",
            "3s",
            "--period",
            "4s",
        ],
    );
    let events = |server: &ServerProc| json(admin(server).args(["query", "event"]));
    wait_for("two expirations run by the schedule", || {
        events(&server)
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["schedule"] == "expire" && e["state"] == "completed")
            .count()
            >= 2
    });
    let all = events(&server);
    let done: Vec<_> =
        all.as_array().unwrap().iter().filter(|e| e["state"] == "completed").collect();
    assert!(done[0]["detail"].as_str().unwrap().contains("expired"), "{all:#}");
    assert!(done[0]["node"].is_null(), "a server action is no node's: {all:#}");
    let windows: Vec<i64> = done.iter().map(|e| e["window_start"].as_i64().unwrap()).collect();
    assert!(windows.windows(2).all(|w| w[1] - w[0] == 4), "one run per window: {windows:?}");
    assert!(
        all.as_array().unwrap().iter().any(|e| e["schedule"] == "expire" && e["state"] == "future"),
        "no next window: {all:#}"
    );
    let log =
        json(admin(&server).args(["query", "actlog", "--search", "schedule standard/expire"]));
    assert!(
        log.as_array()
            .unwrap()
            .iter()
            .any(|e| e["message"].as_str().unwrap().contains("completed")),
        "{log:#}"
    );

    // A catalog backup due while the server is down is missed.
    let soon = qsm_time_now() + 3;
    define(
        &server,
        "db",
        &[
            "--action",
            "backup-db",
            "--start",
            &format!("@{soon}"),
            "--duration",
            "1s",
            "--period",
            "1d",
        ],
    );
    server.kill();
    std::thread::sleep(Duration::from_secs(5));
    let server = ServerProc::start(&data, false);
    wait_for("the missed window", || {
        events(&server)
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["schedule"] == "db" && e["state"] == "missed" && e["window_start"] == soon)
    });
    let schedules = json(admin(&server).args(["query", "schedule"]));
    let db = schedules.as_array().unwrap().iter().find(|s| s["name"] == "db").unwrap().clone();
    assert_eq!(db["next_window"], soon + 86_400, "{schedules:#}");

    admin(&server)
        .args([
            "define",
            "schedule",
            "standard",
            "nightly",
            "--action",
            "incremental",
            "--start",
            "02:00",
            "--duration",
            "1h",
            "--period",
            "1d",
        ])
        .assert()
        .failure()
        .stderr(predicate::str::contains("qsm sched"));
    admin(&server)
        .args([
            "define",
            "schedule",
            "standard",
            "bad",
            "--action",
            "expire",
            "--start",
            "02:00",
            "--duration",
            "2d",
            "--period",
            "1d",
        ])
        .assert()
        .failure()
        .stderr(predicate::str::contains("window"));
    admin(&server).args(["delete", "schedule", "standard", "expire"]).assert().success();
    let left = events(&server);
    assert!(left.as_array().unwrap().iter().all(|e| e["schedule"] != "expire"), "{left:#}");
    admin(&server)
        .args(["delete", "schedule", "standard", "expire"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("no schedule standard/expire"));
}
