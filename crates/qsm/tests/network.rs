//! End-to-end tests of the real `qsm` binary as a server and as clients over real sockets:
//! TLS and the local socket, incremental backups, restores of every kind, two isolated
//! nodes, bad logins, malformed requests, cancellation, and SIGKILL of either side.
//!
//! The suite itself is `suite/network.rs`; `network_s3.rs` runs it again with the catalog on
//! PostgreSQL and the pool on S3 (`network_postgres.rs` holds what only PostgreSQL does:
//! several servers on one catalog).
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

/// Installs Prometheus and promtool when they are missing (the project's script, idempotent):
/// every test that uses either calls it, whichever runs first on a fresh machine.
fn ensure_prometheus() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/ensure-prometheus.sh");
    let status = StdCommand::new("bash").arg(script).status().unwrap();
    assert!(status.success(), "{script} failed: no Prometheus for the metrics tests");
}

/// A Prometheus started on a free loopback port over its own storage, killed when dropped.
struct Prometheus {
    child: Child,
    url: String,
}

impl Prometheus {
    /// Scrapes `target` (`HOST:PORT`, path /metrics) every second.
    fn start(dir: &Path, target: &str) -> Prometheus {
        ensure_prometheus();
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
    ensure_prometheus();
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
/// missed; each schedule's next window is a future event; an archive schedule without
/// objects is refused, and deleting a schedule takes its events.
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
            "archive",
            "--start",
            "02:00",
            "--duration",
            "1h",
            "--period",
            "1d",
        ])
        .assert()
        .failure()
        .stderr(predicate::str::contains("needs --objects"));
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

/// A `qsm sched` of `node` in a process group of its own (so that it and the backup it runs
/// can be killed together), reaching the server through its local socket, which stays the
/// same when the server restarts; with `config` as its client.toml.
fn scheduler(server: &ServerProc, node: &str, pw: &Path, config: &Path) -> Scheduler {
    use std::os::unix::process::CommandExt;
    let child = StdCommand::new(assert_cmd::cargo::cargo_bin("qsm"))
        .env("QSM_SERVER", server.socket())
        .env("QSM_NODE", node)
        .env("QSM_PASSWORD_FILE", pw)
        .env("QSM_CONFIG", config)
        .env("QSM_HOME", "/nonexistent/embedded-must-not-be-used")
        .env("HOME", server.data.parent().unwrap())
        .args(["sched", "--poll", "1s"])
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Scheduler(child)
}

/// A `qsm sched` process group, killed (with what it runs) when dropped: a failed test
/// leaves no scheduler behind.
struct Scheduler(Child);

impl Scheduler {
    /// SIGKILL to the scheduler and the commands it runs.
    fn kill(&mut self) {
        let group = format!("-{}", self.0.id());
        // A group already gone (killed before, then dropped) is not an error.
        let _ = StdCommand::new("kill")
            .args(["-s", "KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.wait();
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The event (not the future window) of `schedule` for `node` in the window starting at
/// `window`.
fn event_of(
    server: &ServerProc,
    schedule: &str,
    node: &str,
    window: i64,
) -> Option<serde_json::Value> {
    let all = json(admin(server).args(["query", "event", "--since", &format!("@{window}")]));
    all.as_array()?
        .iter()
        .find(|e| {
            e["schedule"] == schedule
                && e["node"] == node
                && e["window_start"] == window
                && e["state"] != "future"
        })
        .cloned()
}

/// Issue 26: a client schedule runs on every node associated with it, each node's `qsm sched`
/// starting it inside the window: alpha's and delta's complete (alpha's post-command told the
/// outcome),
/// beta's pre-command fails (the event fails and nothing is backed up), gamma has no scheduler
/// (missed); a server expire schedule runs beside them. The webhook hears of the failure and
/// the miss. Alpha's scheduler survives a server restart and runs the next window; killed in
/// the middle of a run, its event is severed once the window closes.
#[test]
fn client_schedules_run_on_their_nodes_and_every_outcome_is_an_event() {
    let dir = TempDir::new().unwrap();
    let hook = Webhook::start();
    let data = dir.path().join("srv");
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&data).unwrap();
    let settings =
        format!("[[alert]]\nurl = \"{}\"\nevents = [\"failed\", \"missed\"]\n", hook.url);
    fs::write(data.join("server.toml"), settings).unwrap();
    let mut server = ServerProc::start(&data, false);
    let mut pws = Vec::new();
    for node in ["alpha", "beta", "gamma", "delta"] {
        register(&server, node, &format!("{node}-password"));
        pws.push(password_file(dir.path(), &format!("{node}.pw"), &format!("{node}-password")));
    }
    // Alpha's and beta's filespaces exist: the schedule backs up each of a node's filespaces.
    let (src_a, src_b) = (dir.path().join("a"), dir.path().join("b"));
    tree(&src_a);
    tree(&src_b);
    client(&server, "alpha", &pws[0]).arg("backup").arg(&src_a).assert().success();
    client(&server, "beta", &pws[1]).arg("backup").arg(&src_b).assert().success();
    // Delta, like alpha, backs up in the window: two nodes of one schedule run.
    let src_d = dir.path().join("d");
    tree(&src_d);
    client(&server, "delta", &pws[3]).arg("backup").arg(&src_d).assert().success();
    let delta_toml = dir.path().join("delta.toml");
    fs::write(&delta_toml, "").unwrap();

    let told = dir.path().join("post-said");
    let hang = dir.path().join("hang");
    let alpha_toml = dir.path().join("alpha.toml");
    fs::write(
        &alpha_toml,
        format!(
            "pre_command = \"if [ -e '{}' ]; then sleep 60; fi\"\npost_command = \"echo $QSM_SCHEDULE $QSM_EVENT_STATE >> '{}'\"\n",
            hang.display(),
            told.display()
        ),
    )
    .unwrap();
    let beta_toml = dir.path().join("beta.toml");
    fs::write(&beta_toml, "pre_command = \"echo the disk is not mounted >&2; exit 3\"\n").unwrap();

    // Windows of 4 s every 10 s, the first in 6 s (the schedulers log in meanwhile).
    let first = qsm_time_now() + 6;
    let define = |name: &str, action: &str| {
        admin(&server)
            .args(["define", "schedule", "standard", name, "--action", action])
            .args(["--start", &format!("@{first}"), "--duration", "4s", "--period", "10s"])
            .assert()
            .success();
    };
    define("nightly", "incremental");
    define("cleanup", "expire");
    admin(&server)
        .args(["define", "association", "standard", "nightly", "alpha", "beta", "gamma", "delta"])
        .assert()
        .success();
    admin(&server)
        .args(["define", "association", "standard", "cleanup", "alpha"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("only client schedules have nodes"));
    let listed = json(admin(&server).args(["query", "association"]));
    assert_eq!(listed.as_array().unwrap().len(), 4, "{listed:#}");
    // A scheduler whose password is refused stops, said, rather than locking its node out.
    let wrong = password_file(dir.path(), "wrong.pw", "not-the-password");
    client(&server, "gamma", &wrong)
        .args(["sched", "--poll", "1s"])
        .timeout(Duration::from_secs(60))
        .assert()
        .code(1)
        .stderr(predicate::str::contains("wrong account name or password"));
    let mut alpha = scheduler(&server, "alpha", &pws[0], &alpha_toml);
    let mut beta = scheduler(&server, "beta", &pws[1], &beta_toml);
    let mut delta = scheduler(&server, "delta", &pws[3], &delta_toml);

    wait_for("the first window's events", || {
        ["alpha", "beta", "gamma", "delta"].iter().all(|n| {
            event_of(&server, "nightly", n, first).is_some_and(|e| e["state"] != "started")
        })
    });
    let a = event_of(&server, "nightly", "alpha", first).unwrap();
    assert_eq!(a["state"], "completed", "{a:#}");
    assert!(a["detail"].as_str().unwrap().contains("1 filespace: "), "{a:#}");
    let started = a["started"].as_i64().unwrap();
    assert!((first..first + 4).contains(&started), "started inside its window: {a:#}");
    let d = event_of(&server, "nightly", "delta", first).unwrap();
    assert_eq!(d["state"], "completed", "{d:#}");
    let started = d["started"].as_i64().unwrap();
    assert!((first..first + 4).contains(&started), "started inside its window: {d:#}");
    delta.kill();
    let b = event_of(&server, "nightly", "beta", first).unwrap();
    assert_eq!(b["state"], "failed", "{b:#}");
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .contains("pre_command failed (exit 3: the disk is not mounted)"),
        "{b:#}"
    );
    let g = event_of(&server, "nightly", "gamma", first).unwrap();
    assert_eq!(g["state"], "missed", "{g:#}");
    let all = json(admin(&server).args(["query", "event"]));
    assert!(
        all.as_array()
            .unwrap()
            .iter()
            .any(|e| e["schedule"] == "cleanup" && e["state"] == "completed"),
        "the server's expire schedule ran: {all:#}"
    );
    assert!(
        all.as_array().unwrap().iter().any(|e| e["node"] == "gamma" && e["state"] == "future"),
        "each node's next window is a future event: {all:#}"
    );
    wait_for("the failed and missed alerts", || {
        hook.got("failed").iter().any(|x| x["node"] == "beta")
            && hook.got("missed").iter().any(|x| x["node"] == "gamma")
    });
    assert_eq!(fs::read_to_string(&told).unwrap(), "nightly completed\n", "the post-command");
    // Beta's pre-command failed: its filespace was not backed up again.
    let fs_b = json(client(&server, "beta", &pws[1]).args(["query", "filespace"]));
    assert!(fs_b[0]["last_backup"]["started"].as_i64().unwrap() < first, "{fs_b:#}");

    // The server restarts between two windows: alpha's scheduler connects again and runs
    // the next one.
    server.kill();
    std::thread::sleep(Duration::from_secs(1));
    let server = ServerProc::start(&data, false);
    let second = first + 10;
    wait_for("alpha's second window", || {
        event_of(&server, "nightly", "alpha", second).is_some_and(|e| e["state"] == "completed")
    });
    let fs_a = json(client(&server, "alpha", &pws[0]).args(["query", "filespace"]));
    assert!(fs_a[0]["last_backup"]["started"].as_i64().unwrap() >= second, "{fs_a:#}");
    beta.kill();

    // Killed mid-run (its pre-command hangs), alpha's scheduler leaves a started event,
    // which the server severs once the window has closed and alpha's sessions have ended.
    fs::write(&hang, "").unwrap();
    let third = second + 10;
    wait_for("alpha's third window to start", || {
        event_of(&server, "nightly", "alpha", third).is_some_and(|e| e["state"] == "started")
    });
    alpha.kill();
    wait_for("the severed event", || {
        event_of(&server, "nightly", "alpha", third).is_some_and(|e| e["state"] == "severed")
    });
    // Killed mid-run and restarted at once (as systemd does), its successor's first call
    // severs the event its predecessor left, before the window closes. The next window that
    // starts at least 2 s from now (the severing above took some of the windows' time).
    let fourth = first + 10 * ((qsm_time_now() + 2 - first) / 10 + 1);
    let mut alpha = scheduler(&server, "alpha", &pws[0], &alpha_toml);
    wait_for("alpha's fourth window to start", || {
        event_of(&server, "nightly", "alpha", fourth).is_some_and(|e| e["state"] == "started")
    });
    alpha.kill();
    let _successor = scheduler(&server, "alpha", &pws[0], &alpha_toml);
    wait_for("the event severed by the next scheduler", || {
        event_of(&server, "nightly", "alpha", fourth).is_some_and(|e| e["state"] == "severed")
    });
    let e = event_of(&server, "nightly", "alpha", fourth).unwrap();
    assert!(e["detail"].as_str().unwrap().contains("new scheduler"), "{e:#}");
    assert!(e["ended"].as_i64().unwrap() < fourth + 4, "severed inside the window: {e:#}");
    let text = admin(&server).args(["query", "event"]).assert().success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    for state in ["completed", "failed", "missed", "severed", "future"] {
        assert!(text.contains(state), "query event shows {state}: {text}");
    }
}

/// Issue 26: a client option set gives its nodes options: a forced one overrides the node's
/// own flag (said on stderr), an unforced one fills in, patterns add to the node's own; the
/// backup summary names them; a value no client could use is refused when defined; a node
/// taken out of the set has its own options only again.
#[test]
fn client_option_sets_give_nodes_their_options_with_forced_ones_first() {
    let dir = TempDir::new().unwrap();
    let server = ServerProc::start(&dir.path().join("srv"), false);
    register(&server, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "pw", "alpha-password");
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("keep.txt"), "kept ".repeat(1000)).unwrap();
    fs::write(src.join("scratch.skip"), "skipped").unwrap();
    let opt =
        |args: &[&str]| admin(&server).args(["define", "clientopt", "lab"]).args(args).assert();
    admin(&server)
        .args(["define", "cloptset", "lab", "--description", "the lab"])
        .assert()
        .success();
    opt(&["exclude", "*.skip", "--force"]).success();
    opt(&["compression", "lz4", "--force"]).success();
    opt(&["threads", "2"]).success();
    opt(&["colour", "blue"]).failure().stderr(predicate::str::contains("no client option"));
    opt(&["compression", "zstd:99"]).failure().stderr(predicate::str::contains("compression"));
    opt(&["dedup", "maybe"]).failure().stderr(predicate::str::contains("on or off"));
    opt(&["encryption", "off", "--force"]).failure().stderr(predicate::str::contains("never off"));
    admin(&server)
        .args(["define", "clientopt", "none", "threads", "2"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("no client option set none"));
    admin(&server).args(["update", "node", "alpha", "--cloptset", "lab"]).assert().success();
    let sets = json(admin(&server).args(["query", "cloptset"]));
    assert_eq!(sets[0]["options"].as_array().unwrap().len(), 3, "{sets:#}");

    let run = client(&server, "alpha", &pw)
        .args(["backup", "--json", "--compression", "zstd:3"])
        .arg(&src)
        .assert()
        .success()
        .stderr(predicate::str::contains("--compression is overridden"));
    let report: serde_json::Value = serde_json::from_slice(&run.get_output().stdout).unwrap();
    let given = report[0]["server_options"].as_array().unwrap();
    assert_eq!(given[0], "exclude=*.skip (forced)", "{report:#}");
    assert!(given.iter().any(|g| g == "threads=2"), "{report:#}");
    assert!(report[0]["compression"].as_str().unwrap().contains("lz4"), "{report:#}");
    let to = dir.path().join("out");
    client(&server, "alpha", &pw).arg("restore").arg(&src).arg("--to").arg(&to).assert().success();
    assert!(
        to.join("keep.txt").exists() && !to.join("scratch.skip").exists(),
        "the forced exclude"
    );
    let text = client(&server, "alpha", &pw).arg("backup").arg(&src).assert().success();
    let said = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(said.contains("Options from the server's client option set lab"), "{said}");

    admin(&server).args(["update", "node", "alpha", "--no-cloptset"]).assert().success();
    let run = client(&server, "alpha", &pw).args(["backup", "--json"]).arg(&src).assert().success();
    let report: serde_json::Value = serde_json::from_slice(&run.get_output().stdout).unwrap();
    assert!(report[0].get("server_options").is_none(), "{report:#}");
    assert_eq!(report[0]["backed_up"], 1, "scratch.skip is the node's own again: {report:#}");
    admin(&server).args(["delete", "cloptset", "lab"]).assert().success();
    admin(&server).args(["delete", "cloptset", "lab"]).assert().failure();
}

/// Issue 30: a backup that rewrites most of a filespace's files with random data, as
/// ransomware does, is found suspect against the filespace's usual backups, ten of which
/// (small edits) raised nothing. Its filespace is held: the activity log warns, the webhook
/// hears it, the scheduled event that made it ends `suspect`, the filespace cannot be
/// deleted, and the versions from before the attack survive the roll-off of the backups
/// after it and expiration, until an administrator acknowledges.
#[test]
fn a_ransomware_like_backup_is_suspect_and_the_versions_before_it_are_kept_until_acknowledged() {
    let dir = TempDir::new().unwrap();
    let hook = Webhook::start();
    let data = dir.path().join("srv");
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&data).unwrap();
    fs::write(data.join("server.toml"), format!("[[alert]]\nurl = \"{}\"\n", hook.url)).unwrap();
    let server = ServerProc::start(&data, false);
    register(&server, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "pw", "alpha-password");
    let src = dir.path().join("src");
    let docs = src.join("docs");
    fs::create_dir_all(&docs).unwrap();
    let doc = |i: usize| docs.join(format!("doc{i:03}.txt"));
    let text = |i: usize, round: usize| {
        format!("line {i}, edit {round}: the quick brown fox\n").repeat(1000)
    };
    for i in 0..100 {
        fs::write(doc(i), text(i, 0)).unwrap();
    }
    let backup = || json(client(&server, "alpha", &pw).arg("backup").arg(&src));
    backup();
    let holds = || json(admin(&server).args(["query", "hold"]));
    for round in 1..=10 {
        for i in [round, round + 50] {
            fs::write(doc(i), text(i, round)).unwrap();
        }
        backup();
    }
    assert_eq!(holds(), serde_json::json!([]), "small edits are usual");
    let good = dir.path().join("good");
    assert!(StdCommand::new("cp").arg("-a").arg(&src).arg(&good).status().unwrap().success());
    std::thread::sleep(Duration::from_millis(1100));
    let before = qsm_time_now();
    std::thread::sleep(Duration::from_millis(1100));

    // The attack comes while the node's scheduled backup is due: 80 files encrypted.
    let encrypt = |seed: u64| {
        for i in 0..80 {
            fs::write(doc(i), noise(text(i, 0).len(), seed + i as u64)).unwrap();
        }
    };
    encrypt(1);
    let window = qsm_time_now() + 2;
    admin(&server)
        .args(["define", "schedule", "standard", "nightly", "--action", "incremental"])
        .args(["--start", &format!("@{window}"), "--duration", "8s", "--period", "1d"])
        .assert()
        .success();
    admin(&server)
        .args(["define", "association", "standard", "nightly", "alpha"])
        .assert()
        .success();
    let config = dir.path().join("alpha.toml");
    fs::write(&config, "").unwrap();
    let mut sched = scheduler(&server, "alpha", &pw, &config);
    wait_for("the scheduled backup's event", || {
        event_of(&server, "nightly", "alpha", window).is_some_and(|e| e["state"] != "started")
    });
    sched.kill();
    let event = event_of(&server, "nightly", "alpha", window).unwrap();
    assert_eq!(event["state"], "suspect", "{event:#}");
    let detail = event["detail"].as_str().unwrap();
    assert!(detail.contains("suspect backup: filespace "), "{event:#}");
    let fs_name = src.canonicalize().unwrap().display().to_string();
    let held = holds();
    assert_eq!(held.as_array().unwrap().len(), 1, "{held:#}");
    let h = &held[0];
    assert_eq!(
        (&h["node"], &h["filespace"], &h["kind"], &h["by"]),
        (&"alpha".into(), &fs_name.clone().into(), &"suspect".into(), &"server".into()),
        "{h:#}"
    );
    let why = h["reason"].as_str().unwrap();
    assert!(why.contains("entries changed where") && why.contains("of its size where"), "{why}");
    wait_for("the suspect alert", || !hook.got("suspect").is_empty());
    let alert = &hook.got("suspect")[0];
    assert_eq!(
        (&alert["node"], &alert["filespace"]),
        (&"alpha".into(), &fs_name.clone().into()),
        "{alert}"
    );
    assert!(
        alert["message"].as_str().unwrap().contains("--suspect"),
        "how to acknowledge: {alert}"
    );
    let log = json(admin(&server).args(["query", "actlog", "--search", "is suspect"]));
    assert_eq!(log.as_array().unwrap().len(), 1, "{log:#}");

    // The attacker goes on. Versions-exist 2 would roll the good versions off now.
    encrypt(1000);
    backup();
    admin(&server)
        .args(["delete", "filespace", "alpha", &fs_name])
        .assert()
        .failure()
        .stderr(predicate::str::contains("suspect backup not yet acknowledged"));
    let expired = json(admin(&server).args(["expire", "inventory"]));
    assert!(expired["protected"].as_u64().unwrap() >= 80, "{expired:#}");
    assert_eq!(expired["backups"], 0, "{expired:#}");
    let out = dir.path().join("out");
    client(&server, "alpha", &pw)
        .arg("restore")
        .arg(&src)
        .args(["--pit", &format!("@{before}"), "--to"])
        .arg(&out)
        .assert()
        .success();
    assert_same(&good, &out);

    // Acknowledged: the filespace's versions expire again.
    admin(&server)
        .args(["release", "node", "alpha", "--filespace", &fs_name])
        .assert()
        .failure()
        .stderr(predicate::str::contains("is not held"));
    admin(&server)
        .args(["release", "node", "alpha", "--filespace", &fs_name, "--suspect"])
        .assert()
        .success();
    assert_eq!(holds(), serde_json::json!([]));
    let expired = json(admin(&server).args(["expire", "inventory"]));
    assert!(expired["backups"].as_u64().unwrap() >= 80, "{expired:#}");
    assert_eq!(expired["protected"], 0, "{expired:#}");

    // A partial backup (a directory below the filespace's root) cannot slip the files by:
    // it is judged too. One that sends the same files again unchanged is not suspect.
    client(&server, "alpha", &pw).args(["backup", "--selective"]).arg(&docs).assert().success();
    assert_eq!(holds(), serde_json::json!([]), "files sent again unchanged");
    encrypt(2000);
    client(&server, "alpha", &pw).arg("backup").arg(&docs).assert().success();
    let held = holds();
    assert_eq!(held[0]["kind"], "suspect", "{held:#}");
    let log = json(admin(&server).args(["query", "actlog", "--search", "partial backup of node"]));
    assert!(log[0]["message"].as_str().unwrap().contains("is suspect"), "{log:#}");
}

/// Issue 30: an administrator's hold on a node or a filespace stops every deletion of its
/// versions (expiration, delete filespace) until released, and only a system administrator
/// places or releases one; each is in the activity log.
#[test]
fn a_hold_stops_every_deletion_until_released_and_needs_system_privilege() {
    let dir = TempDir::new().unwrap();
    let server = ServerProc::start(&dir.path().join("srv"), false);
    register(&server, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "pw", "alpha-password");
    let src = dir.path().join("src");
    tree(&src);
    let fs_name = src.canonicalize().unwrap().display().to_string();
    client(&server, "alpha", &pw).arg("backup").arg(&src).assert().success();
    fs::remove_file(src.join("docs/a.txt")).unwrap();
    client(&server, "alpha", &pw).arg("backup").arg(&src).assert().success();
    admin(&server)
        .args(["define", "mgmtclass", "standard", "standard", "--versions-deleted", "0"])
        .assert()
        .success();
    admin(&server)
        .args(["register-admin", "op", "--privilege", "operator,policy,storage"])
        .write_stdin("op-password-1\n")
        .assert()
        .success();
    let op_pw = password_file(dir.path(), "op.pw", "op-password-1");
    admin_as(&server, "op", &op_pw)
        .args(["hold", "node", "alpha"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("this needs system"));
    admin(&server)
        .args(["hold", "node", "alpha", "--reason", "litigation 2026-17"])
        .assert()
        .success();
    admin(&server)
        .args(["hold", "node", "alpha"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("node alpha is held already"));
    admin(&server)
        .args(["hold", "node", "alpha", "--filespace", "/not/there"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("node alpha has no filespace /not/there"));
    let held = json(admin(&server).args(["query", "hold"]));
    assert_eq!(
        (&held[0]["filespace"], &held[0]["kind"], &held[0]["reason"]),
        (&"".into(), &"hold".into(), &"litigation 2026-17".into()),
        "{held:#}"
    );
    let expired = json(admin(&server).args(["expire", "inventory"]));
    assert_eq!(
        (expired["backups"].as_u64(), expired["protected"].as_u64()),
        (Some(0), Some(1)),
        "{expired:#}"
    );
    admin_as(&server, "op", &op_pw)
        .args(["delete", "filespace", "alpha", &fs_name])
        .assert()
        .failure()
        .stderr(predicate::str::contains("its node is held"));
    admin_as(&server, "op", &op_pw)
        .args(["release", "node", "alpha"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("this needs system"));
    admin(&server).args(["release", "node", "alpha"]).assert().success();
    // A retention lock cannot be undone: a system administrator's to give, and bounded.
    admin_as(&server, "op", &op_pw)
        .args(["update", "mgmtclass", "standard", "standard", "--retain-min", "30"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("this needs system"));
    admin(&server)
        .args(["update", "mgmtclass", "standard", "standard", "--retain-min", "36501"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("at most 36500 days"));
    admin(&server)
        .args(["release", "node", "alpha", "--suspect"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--filespace"));
    let log = json(admin(&server).args(["query", "actlog", "--search", "node alpha"]));
    let said: Vec<&str> =
        log.as_array().unwrap().iter().filter_map(|e| e["message"].as_str()).collect();
    assert!(said.iter().any(|m| m.ends_with("held node alpha: litigation 2026-17")), "{said:#?}");
    assert!(said.iter().any(|m| m.ends_with("released node alpha")), "{said:#?}");
    let expired = json(admin(&server).args(["expire", "inventory"]));
    assert_eq!(
        (expired["backups"].as_u64(), expired["protected"].as_u64()),
        (Some(1), Some(0)),
        "{expired:#}"
    );
}

/// A data directory's PEM certificates, one after the other: what a client trusts to reach
/// either of two servers.
fn both_certs(dir: &Path, a: &ServerProc, b: &ServerProc) -> PathBuf {
    let mut pem = fs::read(a.data.join("tls/cert.pem")).unwrap();
    pem.extend(fs::read(b.data.join("tls/cert.pem")).unwrap());
    let path = dir.join("both.pem");
    fs::write(&path, pem).unwrap();
    path
}

/// The versions `target` holds replicated from node `node`.
fn replicated(target: &ServerProc, node: &str) -> usize {
    let opened = open_catalog(target);
    let cat = opened.catalog();
    let Some(n) = cat.node(node).unwrap() else { return 0 };
    cat.filespaces(n.id).unwrap().iter().map(|f| cat.replica_versions(f.id).unwrap().len()).sum()
}

/// Issue 30, parts 1 and 2: a node (plain, and one encrypted with dedup) is replicated to a
/// second server over TLS; with the source stopped, both restore byte-exact from the replica,
/// named second in a failover list; a change of 5% of the tree sends about what it stored;
/// a replication cut by kill -9 of the source resumes without sending again what arrived;
/// and a damaged container of the source is repaired from the replica's copies.
#[test]
fn nodes_replicate_to_a_second_server_restore_from_it_and_repair_the_source() {
    let dir = TempDir::new().unwrap();
    let d = dir.path();
    let src_data = d.join("source");
    // Killed mid-replication below: its successor waits out its lease before it replicates.
    fs::DirBuilder::new().mode(0o700).create(&src_data).unwrap();
    let settings = format!("catalog = {:?}\nlease_seconds = 6\n", src_data.join("catalog.db"));
    fs::write(src_data.join("server.toml"), settings).unwrap();
    let mut source = ServerProc::start(&src_data, true);
    let replica = ServerProc::start(&d.join("replica"), true);
    // The replica's account for the source: replication only.
    admin(&replica)
        .args(["register-admin", "from-source", "--privilege", "replication"])
        .write_stdin("replication-password-1\n")
        .assert()
        .success();
    let repl_pw = password_file(d, "repl.pw", "replication-password-1");
    admin_as(&replica, "from-source", &repl_pw)
        .env("QSM_CA", replica.data.join("tls/cert.pem"))
        .args(["query", "node"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("is a replication account"));
    admin(&source)
        .args(["define", "server", "replica", "--address", &replica.url, "--account"])
        .arg("from-source")
        .arg("--account-password-file")
        .arg(&repl_pw)
        .arg("--cert")
        .arg(replica.data.join("tls/cert.pem"))
        .assert()
        .success();
    let servers = json(admin(&source).args(["query", "server"]));
    assert_eq!(servers[0]["account"], "from-source", "{servers:#}");
    assert!(!servers.to_string().contains("replication-password-1"), "{servers:#}");

    // alpha in the clear, beta encrypted and deduplicating.
    let src = d.join("src");
    tree(&src);
    big_tree(&src.join("big"), 20);
    let pass = password_file(d, "passphrase", "a passphrase for beta");
    let key = d.join("beta.key");
    let mut pws = Vec::new();
    for node in ["alpha", "beta"] {
        register(&source, node, &format!("{node}-password"));
        pws.push(password_file(d, &format!("{node}.pw"), &format!("{node}-password")));
    }
    let node_cmd = |server: &str, node: &str, pw: &Path, ca: &Path| {
        let mut c = Command::cargo_bin("qsm").unwrap();
        c.env("QSM_SERVER", server)
            .env("QSM_NODE", node)
            .env("QSM_PASSWORD_FILE", pw)
            .env("QSM_CA", ca)
            .env("QSM_HOME", "/nonexistent/embedded-must-not-be-used")
            .env("HOME", d)
            .env("QSM_PASSPHRASE_FILE", &pass)
            .env("QSM_KEY_FILE", &key);
        c
    };
    let src_ca = source.data.join("tls/cert.pem");
    node_cmd(&source.url, "alpha", &pws[0], &src_ca).arg("backup").arg(&src).assert().success();
    node_cmd(&source.url, "beta", &pws[1], &src_ca)
        .args(["backup", "--encryption", "on", "--dedup", "on"])
        .arg(&src)
        .assert()
        .success();
    // Second backups after a deletion: inactive versions to replicate as such.
    fs::remove_file(src.join("empty")).unwrap();
    node_cmd(&source.url, "alpha", &pws[0], &src_ca).arg("backup").arg(&src).assert().success();
    node_cmd(&source.url, "beta", &pws[1], &src_ca)
        .args(["backup", "--encryption", "on", "--dedup", "on"])
        .arg(&src)
        .assert()
        .success();
    let first = json(admin(&source).args(["replicate", "node", "alpha", "beta"]));
    assert!(first["versions"].as_u64().unwrap() > 20, "{first:#}");
    assert_eq!(
        (first["skipped"].as_u64(), first["stopped"].as_str()),
        (Some(0), None),
        "{first:#}"
    );
    // Nothing new: nothing is sent.
    let again = json(admin(&source).args(["replicate", "node", "alpha", "beta"]));
    assert_eq!(again["versions"].as_u64(), Some(0), "{again:#}");
    assert_eq!(again["skipped"], first["versions"], "{again:#}");

    // The source is gone: both nodes restore from the replica, named second.
    source.kill();
    let both = both_certs(d, &source, &replica);
    let urls = format!("{},{}", source.url, replica.url);
    for (node, pw) in [("alpha", &pws[0]), ("beta", &pws[1])] {
        let out = d.join(format!("out-{node}"));
        node_cmd(&urls, node, pw, &both)
            .arg("restore")
            .arg(&src)
            .arg("--to")
            .arg(&out)
            .assert()
            .success();
        assert_same(&src, &out);
    }
    // The replica's administrator sees which nodes are replicas; they back up only on their
    // own server.
    let nodes = json(admin(&replica).args(["query", "node"]));
    let alpha = nodes.as_array().unwrap().iter().find(|n| n["name"] == "alpha").unwrap();
    assert_eq!(alpha["replica_of"], "from-source", "{nodes:#}");
    node_cmd(&replica.url, "alpha", &pws[0], &both)
        .arg("backup")
        .arg(&src)
        .assert()
        .failure()
        .stderr(predicate::str::contains("this node is a replica"));

    // The source again; 5% of the tree changes; what crosses is about what was stored.
    let mut source = ServerProc::start(&src_data, true);
    let src_ca = source.data.join("tls/cert.pem");
    let changed: Vec<u8> = (0..1_000_000u32).map(|i| (i.wrapping_mul(40_503) >> 7) as u8).collect();
    fs::write(src.join("big/f007"), changed).unwrap();
    fs::remove_file(src.join("docs/a.txt")).unwrap();
    let backup = json(node_cmd(&source.url, "alpha", &pws[0], &src_ca).arg("backup").arg(&src));
    let stored = backup[0]["bytes_stored"].as_u64().unwrap();
    let incr = json(admin(&source).args(["replicate", "node", "alpha"]));
    let (sent, frames) =
        (incr["wire_bytes"].as_u64().unwrap(), incr["frame_bytes"].as_u64().unwrap());
    assert!((1..=3).contains(&incr["versions"].as_u64().unwrap()), "{incr:#}");
    assert_eq!(incr["deactivated"].as_u64(), Some(1), "docs/a.txt, deleted: {incr:#}");
    assert!(stored > 50_000, "{backup:#}");
    assert!(frames <= stored && sent as f64 <= 1.1 * stored as f64, "{incr:#} {backup:#}");

    // gamma: a replication cut by kill -9 of the source resumes where it was.
    register(&source, "gamma", "gamma-password");
    let gamma_pw = password_file(d, "gamma.pw", "gamma-password");
    let gamma_src = d.join("gamma");
    big_tree(&gamma_src, 120);
    node_cmd(&source.url, "gamma", &gamma_pw, &src_ca)
        .args(["backup", "--compression", "off"])
        .arg(&gamma_src)
        .assert()
        .success();
    let total = {
        let opened = open_catalog(&source);
        let cat = opened.catalog();
        let gamma = cat.node("gamma").unwrap().unwrap().id;
        let mut n = 0;
        for fs in cat.filespaces(gamma).unwrap() {
            cat.for_each_version(fs.id, &mut |_| {
                n += 1;
                Ok(())
            })
            .unwrap();
        }
        n
    };
    let mut child = StdCommand::new(assert_cmd::cargo::cargo_bin("qsm"))
        .args(["admin", "--server"])
        .arg(source.socket())
        .args(["replicate", "node", "gamma"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("a first commit on the replica", || replicated(&replica, "gamma") > 0);
    source.kill();
    let _ = child.wait();
    // The target may still commit what it had received when the source died: what arrived
    // is what it holds once that count holds still.
    let mut arrived = replicated(&replica, "gamma");
    let mut still = 0;
    while still < 5 {
        std::thread::sleep(Duration::from_millis(200));
        let now = replicated(&replica, "gamma");
        still = if now == arrived { still + 1 } else { 0 };
        arrived = now;
    }
    assert!(arrived < total, "the cut came too late to test anything: {arrived}");
    let source = ServerProc::start(&src_data, true);
    let resumed = loop {
        let out = admin(&source).args(["replicate", "node", "gamma", "--json"]).output().unwrap();
        if out.status.success() {
            break serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("is already running"), "{err}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(resumed["skipped"].as_u64(), Some(arrived as u64), "{resumed:#}");
    assert_eq!(resumed["versions"].as_u64(), Some((total - arrived) as u64), "{resumed:#}");
    assert_eq!(replicated(&replica, "gamma"), total);

    // A schedule replicates by itself: delta's first backup reaches the replica in a window.
    register(&source, "delta", "delta-password");
    let delta_pw = password_file(d, "delta.pw", "delta-password");
    node_cmd(&source.url, "delta", &delta_pw, &source.data.join("tls/cert.pem"))
        .arg("backup")
        .arg(src.join("docs"))
        .assert()
        .success();
    let now = qsm_time_now();
    admin(&source)
        .args(["define", "schedule", "standard", "to-dr", "--action", "replicate"])
        .args(["--objects", "delta", "target=replica", "--start", &format!("@{now}")])
        .args(["--duration", "50s", "--period", "60s"])
        .assert()
        .success();
    let event = || {
        let all = json(admin(&source).args(["query", "event"]));
        all.as_array().unwrap().iter().find(|e| e["schedule"] == "to-dr").cloned()
    };
    wait_for("the scheduled replication", || {
        event().is_some_and(|e| e["state"] != "started" && e["state"] != "future")
    });
    let done = event().unwrap();
    assert_eq!(done["state"], "completed", "{done:#}");
    assert!(done["detail"].as_str().unwrap().contains("replicated to replica"), "{done:#}");
    assert!(replicated(&replica, "delta") >= 2, "{done:#}");

    // A damaged container of the source: audited, repaired from the replica, restored whole.
    damage_the_biggest_container(&source);
    let audit =
        admin(&source).args(["audit", "stgpool", "--mark-damaged", "--json"]).output().unwrap();
    let audit: serde_json::Value = serde_json::from_slice(&audit.stdout).unwrap();
    assert!(!audit["damaged"].as_array().unwrap().is_empty(), "{audit:#}");
    let repair = json(admin(&source).args(["repair", "stgpool"]));
    assert_eq!(repair["unrepaired"].as_u64(), Some(0), "{repair:#}");
    assert!(repair["repaired"].as_u64().unwrap() >= 1, "{repair:#}");
    let audit = json(admin(&source).args(["audit", "stgpool"]));
    assert!(audit["damaged"].as_array().unwrap().is_empty(), "{audit:#}");
    let src_ca = source.data.join("tls/cert.pem");
    for (node, pw, tree) in [("alpha", &pws[0], &src), ("gamma", &gamma_pw, &gamma_src)] {
        let out = d.join(format!("repaired-{node}"));
        node_cmd(&source.url, node, pw, &src_ca)
            .arg("restore")
            .arg(tree)
            .arg("--to")
            .arg(&out)
            .assert()
            .success();
        assert_same(tree, &out);
    }
}

/// Issue 30: the `Replica` service from the other side, as a hostile source or a node would
/// use it. A node's session is refused; a replication account cannot take over a node of the
/// target's own, nor touch one it did not make (answered as missing); a version with a corrupt
/// frame is refused and named, the others stored; a bad password hash or scope secret is
/// refused.
#[test]
fn the_replica_service_refuses_nodes_foreign_nodes_and_corrupt_frames() {
    use qsm_proto::v1::{
        self, node_client::NodeClient, replica_client::ReplicaClient, replica_op::Op,
    };
    let dir = TempDir::new().unwrap();
    let target = ServerProc::start(&dir.path().join("srv"), false);
    register(&target, "own", "own-password");
    admin(&target)
        .args(["register-admin", "repl", "--privilege", "replication"])
        .write_stdin("repl-password-1\n")
        .assert()
        .success();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(target.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let session = |account: &str, password: &str, admin: bool| {
            let login = v1::LoginRequest {
                protocol: qsm_proto::PROTOCOL,
                account: account.into(),
                password: password.into(),
                admin,
                ..Default::default()
            };
            let channel = channel.clone();
            async move {
                let token =
                    NodeClient::new(channel.clone()).login(login).await.unwrap().into_inner().token;
                let bearer: tonic::metadata::MetadataValue<_> =
                    format!("Bearer {token}").parse().unwrap();
                ReplicaClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
                    r.metadata_mut().insert("authorization", bearer.clone());
                    Ok(r)
                })
            }
        };
        let node_def = |name: &str| v1::ReplicaNode {
            name: name.into(),
            password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"
                .into(),
            scope: "node:x".into(),
            scope_secret: vec![7u8; 32].into(),
            domain: "standard".into(),
            ..Default::default()
        };
        // A node's session.
        let mut own = session("own", "own-password", false).await;
        let e = own.put_node(node_def("stolen")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

        let mut repl = session("repl", "repl-password-1", true).await;
        // The target's own node: not taken over, not read.
        let e = repl.put_node(node_def("own")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
        let held = v1::HeldRequest { node: "own".into(), filespace: "/home".into() };
        let e = repl.held(held.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
        let frames = v1::ReplicaFramesRequest {
            node: "own".into(),
            filespace: "/home".into(),
            chunks: vec![v1::ReplicaChunkAt { origin: 1, index: 0 }],
        };
        let e = repl.frames(frames).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
        // Bad definitions.
        let e = repl
            .put_node(v1::ReplicaNode { password_hash: "plain".into(), ..node_def("x") })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        let e = repl
            .put_node(v1::ReplicaNode { scope_secret: vec![1u8; 3].into(), ..node_def("x") })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

        // A replica of its own; the same node from a source whose catalog was restored since
        // (another incarnation: its ids name other versions now) is refused.
        repl.put_node(v1::ReplicaNode { incarnation: 41, ..node_def("mine") }).await.unwrap();
        repl.put_node(v1::ReplicaNode { incarnation: 41, ..node_def("mine") }).await.unwrap();
        let e = repl
            .put_node(v1::ReplicaNode { incarnation: 43, ..node_def("mine") })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("another incarnation"), "{e:?}");
        // Then a stream whose second version's frame is corrupt.
        let mut frame = Vec::new();
        let mut encoder =
            qsm_codec::FrameEncoder::new(qsm_codec::Compression::parse("zstd:3").unwrap()).unwrap();
        let header = encoder.encode(&b"replicated data ".repeat(1000), &mut frame).unwrap();
        frame.truncate(header.frame_len());
        let mut bad = frame.clone();
        let at = bad.len() - 10;
        bad[at] ^= 0x55;
        let version = |origin: u64, path: &str| {
            Op::Begin(v1::ReplicaVersion {
                origin,
                path: path.as_bytes().to_vec().into(),
                attrs: Some(v1::Attributes { size: 16_000, mode: 0o100644, ..Default::default() }),
                inserted: 1_700_000_000,
                ..Default::default()
            })
        };
        let ops = vec![
            Op::Start(v1::HeldRequest { node: "mine".into(), filespace: "/data".into() }),
            version(10, "a"),
            Op::Frame(frame.into()),
            Op::End(v1::Empty {}),
            version(11, "b"),
            Op::Frame(bad.into()),
            Op::End(v1::Empty {}),
            Op::Finish(v1::Empty {}),
        ];
        let batch = v1::ReplicaBatch {
            ops: ops.into_iter().map(|op| v1::ReplicaOp { op: Some(op) }).collect(),
        };
        // The corrupt version is refused and named; the good one is stored.
        let reply = repl.send(tokio_stream::iter(vec![batch])).await.unwrap().into_inner();
        assert_eq!(reply.versions, 1, "{reply:?}");
        assert_eq!(reply.refused.len(), 1, "{reply:?}");
        assert!(
            reply.refused[0].starts_with("version 11 (b), chunk 0: the frame is damaged"),
            "{reply:?}"
        );
        let held = v1::HeldRequest { node: "mine".into(), filespace: "/data".into() };
        let mut stream = repl.held(held).await.unwrap().into_inner();
        let mut origins = Vec::new();
        while let Some(b) = stream.message().await.unwrap() {
            origins.extend(b.origins);
        }
        assert_eq!(origins, [10], "only the good version is held");
    });
}
