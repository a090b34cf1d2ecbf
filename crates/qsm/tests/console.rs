//! The web console and its HTTP/JSON API (issue 27), end to end: a real `qsm server` with
//! `--http-listen`, real HTTPS requests, and Debian's Chromium driven through ChromeDriver
//! (the WebDriver protocol, plain HTTP and JSON). `.ci/run` installs both; without them the
//! browser test fails, saying what to install, rather than passing untried.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unused_macros)]

const POSTGRES: bool = false;
const S3: bool = false;

include!("suite/helpers.rs");

use serde_json::{Value, json};

/// A server with the console on, the administrators `sysadm` (system) and `oper`
/// (operator), and the node alpha, backed up once.
struct Site {
    _dir: TempDir,
    server: ServerProc,
    console: String,
    alpha_pw: PathBuf,
    src: PathBuf,
}

fn site() -> Site {
    let dir = TempDir::new().unwrap();
    let server =
        ServerProc::start_with(&dir.path().join("srv"), true, &["--http-listen", "127.0.0.1:0"]);
    let console = server.console.clone().expect("the server did not say where its console is");
    for (name, privilege) in [("sysadm", "system"), ("oper", "operator")] {
        admin(&server)
            .args(["register-admin", name, "--privilege", privilege])
            .write_stdin("admin-password\n")
            .assert()
            .success();
    }
    register(&server, "alpha", "alpha-password");
    let alpha_pw = password_file(dir.path(), "alpha.pw", "alpha-password");
    let src = dir.path().join("src");
    tree(&src);
    client(&server, "alpha", &alpha_pw).arg("backup").arg(&src).assert().success();
    Site { _dir: dir, server, console, alpha_pw, src }
}

/// An HTTPS client of the console, trusting the server's certificate; it keeps no cookies
/// unless told.
struct Api {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    base: String,
}

/// An answer: status, headers, body as JSON (`Null` when empty or not JSON).
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Api {
    fn new(site: &Site) -> Api {
        let pem = fs::read(site.server.data.join("tls/cert.pem")).unwrap();
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
            .build()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Api { rt, http, base: site.console.trim_end_matches('/').to_owned() }
    }

    fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        if let Some(b) = body {
            r = r.header("content-type", "application/json").body(b.to_owned());
        }
        self.rt.block_on(async {
            let answer = r.send().await.unwrap();
            let (status, headers) = (answer.status().as_u16(), answer.headers().clone());
            let bytes = answer.bytes().await.unwrap();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            Answer { status, headers, body }
        })
    }

    /// A request with a bearer token (or none).
    fn as_(&self, token: Option<&str>, method: &str, path: &str, body: Option<&str>) -> Answer {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> =
            auth.as_deref().map(|a| vec![("authorization", a)]).unwrap_or_default();
        self.call(method, path, &headers, body)
    }

    fn login(&self, name: &str, password: &str, node: bool) -> Answer {
        let body = json!({"name": name, "password": password, "node": node}).to_string();
        self.call("POST", "/api/login", &[], Some(&body))
    }

    fn token(&self, name: &str, password: &str, node: bool) -> String {
        let a = self.login(name, password, node);
        assert_eq!(a.status, 200, "login of {name}: {}", a.body);
        a.body["token"].as_str().unwrap().to_owned()
    }
}

/// Every endpoint of the administrators' API, with a body where it takes one.
const ADMIN_ENDPOINTS: &[(&str, &str, Option<&str>)] = &[
    ("GET", "/api/overview", None),
    ("GET", "/api/nodes", None),
    ("GET", "/api/nodes/alpha/filespaces", None),
    ("GET", "/api/nodes/alpha/backups", None),
    ("POST", "/api/nodes/alpha/lock", None),
    ("POST", "/api/nodes/alpha/unlock", None),
    ("GET", "/api/sessions", None),
    ("POST", "/api/sessions/999999/cancel", None),
    ("GET", "/api/processes", None),
    ("POST", "/api/processes/999999/cancel", None),
    ("GET", "/api/events", None),
    ("GET", "/api/actlog", None),
    ("GET", "/api/policy", None),
    ("GET", "/api/schedules", None),
    ("GET", "/api/stgpools", None),
    ("POST", "/api/expire", Some("{}")),
    ("POST", "/api/reclaim", Some(r#"{"threshold": 90}"#)),
    ("POST", "/api/audit", Some("{}")),
    ("POST", "/api/backup-db", None),
];

#[test]
fn the_api_checks_who_calls_every_endpoint_and_what_they_send() {
    let site = site();
    let api = Api::new(&site);

    // The description names every endpoint.
    let doc = api.as_(None, "GET", "/api/openapi.json", None);
    assert_eq!(doc.status, 200);
    assert!(doc.body["openapi"].as_str().unwrap().starts_with("3."), "{}", doc.body["openapi"]);
    let paths = doc.body["paths"].as_object().unwrap();
    for (method, path, _) in ADMIN_ENDPOINTS {
        let templated = path.replace("/alpha/", "/{name}/").replace("/999999/", "/{id}/");
        let op = &paths.get(&templated).unwrap_or_else(|| panic!("{templated} undocumented"));
        assert!(op.get(method.to_lowercase()).is_some(), "{method} {templated} undocumented");
    }
    for path in ["/api/login", "/api/logout", "/api/whoami"] {
        assert!(paths.contains_key(path), "{path} undocumented");
    }

    // No token, a made-up token: 401 everywhere, with a message, whatever the request.
    let node = api.token("alpha", "alpha-password", true);
    for (method, path, body) in ADMIN_ENDPOINTS {
        for token in [None, Some("00ff"), Some("")] {
            let a = api.as_(token, method, path, *body);
            assert_eq!(a.status, 401, "{method} {path} with {token:?}: {}", a.body);
            assert!(!a.body["error"].as_str().unwrap().is_empty(), "{method} {path}");
        }
        // A node's session is no administrator's.
        let a = api.as_(Some(&node), method, path, *body);
        assert_eq!(a.status, 403, "{method} {path} as a node: {}", a.body);
        assert!(a.body["error"].as_str().unwrap().contains("node"), "{}", a.body);
    }
    assert_eq!(api.as_(Some(&node), "GET", "/api/whoami", None).body["admin"], false);

    // Operator and system privilege: the core's checks, as on the command line.
    let oper = api.token("oper", "admin-password", false);
    let sys = api.token("sysadm", "admin-password", false);
    for (method, path, body) in [
        ("POST", "/api/reclaim", Some("{}")),
        ("POST", "/api/audit", Some("{}")),
        ("POST", "/api/expire", Some("{}")),
    ] {
        let a = api.as_(Some(&oper), method, path, body);
        assert_eq!(a.status, 403, "{path} by an operator: {}", a.body);
        assert!(a.body["error"].as_str().unwrap().contains("privilege"), "{}", a.body);
    }
    let a = api.as_(Some(&oper), "POST", "/api/nodes/alpha/lock", None);
    assert_eq!(a.status, 403, "an operator locks a node: {}", a.body);
    let a = api.as_(Some(&sys), "POST", "/api/nodes/alpha/lock", None);
    assert_eq!(a.status, 204, "{}", a.body);
    client(&site.server, "alpha", &site.alpha_pw)
        .arg("backup")
        .arg(&site.src)
        .assert()
        .failure()
        .stderr(predicate::str::contains("locked"));
    assert_eq!(api.as_(Some(&sys), "POST", "/api/nodes/alpha/unlock", None).status, 204);
    let a = api.as_(Some(&sys), "POST", "/api/reclaim", Some(r#"{"threshold": 90}"#));
    assert_eq!(a.status, 200, "{}", a.body);
    // A report of a run to its end: what reclaim stgpool --json prints.
    assert!(a.body["containers"].is_u64() && a.body["stopped"].is_null(), "{}", a.body);
    let a = api.as_(Some(&sys), "POST", "/api/audit", None);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["damaged"], json!([]), "{}", a.body);
    // TSM's BACKUP DB: an operator may.
    let a = api.as_(Some(&oper), "POST", "/api/backup-db", None);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body["bytes"].as_u64().unwrap() > 0, "{}", a.body);
    let a = api.as_(Some(&sys), "POST", "/api/expire", Some(r#"{"resource": 2}"#));
    assert_eq!(a.status, 200, "{}", a.body);

    // What the console shows: alpha backed up moments ago, its history, its filespace.
    let o = api.as_(Some(&oper), "GET", "/api/overview", None).body;
    assert_eq!(o["nodes"]["total"], 1, "{o}");
    assert_eq!(o["nodes"]["protected"], 1, "{o}");
    assert_eq!(o["node_status"][0]["name"], "alpha", "{o}");
    assert_eq!(o["node_status"][0]["status"], "protected", "{o}");
    assert!(o["data"]["protected_bytes"].as_u64().unwrap() >= 3_006_000, "{o}");
    assert!(o["pool"]["bytes"].as_u64().unwrap() > 0, "{o}");
    let history = api.as_(Some(&oper), "GET", "/api/nodes/alpha/backups", None).body;
    let runs = history.as_array().unwrap();
    assert_eq!(runs.len(), 1, "{history}");
    assert_eq!(runs[0]["result"], "completed", "{history}");
    assert!(runs[0]["bytes"].as_u64().unwrap() > 0, "{history}");
    assert_eq!(runs[0]["filespace"], site.src.to_str().unwrap(), "{history}");
    // The same history on the command line, from the same core operation.
    let cli = json(admin(&site.server).args(["query", "backups", "alpha"]));
    assert_eq!(cli, history, "the command line and the API differ");
    let none =
        json(admin(&site.server).args(["query", "backups", "alpha", "--since", "2100-01-01"]));
    assert_eq!(none, json!([]));
    let fs = api.as_(Some(&oper), "GET", "/api/nodes/alpha/filespaces", None).body;
    assert_eq!(fs[0]["last_completed"]["objects"], runs[0]["objects"], "{fs}");
    let sessions = api.as_(Some(&oper), "GET", "/api/sessions", None).body;
    assert!(sessions.as_array().unwrap().iter().any(|s| s["account"] == "oper"), "{sessions}");

    // Bad input: a 4xx naming what was wrong, never a 500.
    for (method, path, body, status, says) in [
        ("GET", "/api/nodes/nosuch/filespaces", None, 404, "nosuch"),
        ("GET", "/api/nodes/nosuch/backups", None, 404, "nosuch"),
        ("GET", "/api/nodes/alpha/backups?filespace=/nowhere", None, 404, "/nowhere"),
        ("GET", "/api/nodes/alpha/backups?since=yesterday", None, 400, "since"),
        ("POST", "/api/nodes/nosuch/lock", None, 404, "nosuch"),
        ("POST", "/api/sessions/abc/cancel", None, 400, "abc"),
        ("POST", "/api/sessions/999999/cancel", None, 404, "999999"),
        ("POST", "/api/processes/-1/cancel", None, 400, "-1"),
        ("GET", "/api/actlog?limit=0", None, 400, "limit"),
        ("GET", "/api/actlog?limit=many", None, 400, "limit"),
        ("GET", "/api/actlog?colour=red", None, 400, "colour"),
        ("POST", "/api/reclaim", Some("{\"threshold\": "), 400, "EOF"),
        ("POST", "/api/reclaim", Some(r#"{"threshold": "high"}"#), 400, "threshold"),
        ("POST", "/api/expire", Some(r#"{"resource": 0}"#), 400, "resource"),
        ("POST", "/api/expire", Some(r#"{"duration_minutes": 2147483648}"#), 400, "duration"),
        ("POST", "/api/expire", Some(r#"{"nodes": ["nosuch"]}"#), 404, "nosuch"),
        ("POST", "/api/audit", Some(r#"{"mark": true}"#), 400, "mark"),
        ("GET", "/api/nothing-here", None, 404, "no such"),
    ] {
        let a = api.as_(Some(&sys), method, path, body);
        assert_eq!(a.status, status, "{method} {path} {body:?}: {}", a.body);
        let error = a.body["error"].as_str().unwrap_or_else(|| panic!("{path}: {}", a.body));
        assert!(error.contains(says), "{method} {path}: {error:?} does not name {says:?}");
    }
    let garbage = api.call("POST", "/api/login", &[], Some("{not json"));
    assert_eq!(garbage.status, 400, "{}", garbage.body);
    let huge = "x".repeat(5000);
    let a = api.login(&huge, "pw", false);
    assert_eq!(a.status, 400, "{}", a.body);

    // A body that is not JSON is refused, not taken for no options: no expiration of every
    // node ran for a form sent by mistake.
    let auth = format!("Bearer {sys}");
    let form = [("authorization", auth.as_str()), ("content-type", "text/plain")];
    let a = api.call("POST", "/api/expire", &form, None);
    assert_eq!(a.status, 200, "an empty body takes the defaults: {}", a.body);
    let sent = reqwest::Method::POST;
    let r = api.rt.block_on(
        api.http
            .request(sent, format!("{}/api/expire", api.base))
            .header("authorization", &auth)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(r#"{"nodes": ["nope"]}"#)
            .send(),
    );
    assert_eq!(r.unwrap().status().as_u16(), 415);
    for (method, path) in
        [("GET", "/api/login"), ("DELETE", "/api/nodes"), ("PUT", "/api/overview")]
    {
        let a = api.as_(Some(&sys), method, path, None);
        assert_eq!(a.status, 405, "{method} {path}");
        assert!(a.body["error"].as_str().unwrap().contains(method), "{}", a.body);
    }
    let a = api.as_(Some(&sys), "POST", "/api/audit", Some("null"));
    assert_eq!(a.status, 200, "null is no options: {}", a.body);
    let a = api.as_(Some(&sys), "POST", "/api/reclaim", Some(r#"{"threshold": 0}"#));
    assert_eq!(a.status, 400, "{}", a.body);
    // Every answer, errors too, forbids framing and running anything.
    let a = api.as_(None, "GET", "/api/nothing", None);
    let csp = a.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert_eq!(a.headers["x-frame-options"], "DENY");

    // A script's login answers with the token and sets no cookie; a page's sets an HttpOnly
    // `__Host-` cookie (only this host, over HTTPS, every path: no neighbour can shadow it,
    // SameSite=Strict) and its script never sees the token. A change made with the cookie
    // needs the CSRF header, and is refused from another site's page.
    assert!(!api.login("sysadm", "admin-password", false).headers.contains_key("set-cookie"));
    let body = json!({"name": "sysadm", "password": "admin-password", "cookie": true});
    let a = api.call("POST", "/api/login", &[], Some(&body.to_string()));
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.get("token").is_none(), "a page's login gave its script the token: {}", a.body);
    let cookie = a.headers["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.starts_with("__Host-qsm_session="), "{cookie}");
    for flag in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(flag), "{cookie}");
    }
    let jar = cookie.split(';').next().unwrap().to_owned();
    let me = api.call("GET", "/api/whoami", &[("cookie", &jar)], None);
    assert_eq!((me.status, me.body["account"].clone()), (200, json!("sysadm")), "{}", me.body);
    let forged = api.call("POST", "/api/nodes/alpha/lock", &[("cookie", &jar)], None);
    assert_eq!(forged.status, 403, "{}", forged.body);
    assert!(forged.body["error"].as_str().unwrap().contains("X-QSM-CSRF"), "{}", forged.body);
    let foreign = [("cookie", jar.as_str()), ("x-qsm-csrf", "1"), ("origin", "https://evil")];
    assert_eq!(api.call("POST", "/api/nodes/alpha/lock", &foreign, None).status, 403);
    let nodes = json(admin(&site.server).args(["query", "node"]));
    assert_eq!(nodes[0]["locked"], false, "a refused change happened: {nodes}");
    let own = [("cookie", jar.as_str()), ("x-qsm-csrf", "1")];
    assert_eq!(api.call("POST", "/api/nodes/alpha/lock", &own, None).status, 204);
    assert_eq!(json(admin(&site.server).args(["query", "node"]))[0]["locked"], true);
    assert_eq!(api.call("POST", "/api/nodes/alpha/unlock", &own, None).status, 204);
    // Logged out: the cookie and the token are dead.
    let out = api.call("POST", "/api/logout", &own, None);
    assert_eq!(out.status, 204);
    assert!(out.headers["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    assert_eq!(api.call("GET", "/api/whoami", &[("cookie", &jar)], None).status, 401);
    // What the API did is in the activity log, by whom.
    let log = api.as_(Some(&sys), "GET", "/api/actlog?search=locked", None).body;
    let entries = log["entries"].as_array().unwrap();
    assert!(entries.iter().any(|e| e["message"].as_str().unwrap().contains("sysadm")), "{log}");

    // Wrong passwords: refused alike, then locked out (the lockouts of every front end).
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let a = api.login("sysadm", "wrong-password", false);
        statuses.push(a.status);
        if a.status == 429 {
            assert!(a.headers.contains_key("retry-after"));
            break;
        }
        assert_eq!(a.body["error"], "wrong account name or password", "{}", a.body);
    }
    assert_eq!(statuses.last(), Some(&429), "never locked out: {statuses:?}");
    let a = api.login("sysadm", "admin-password", false);
    assert_eq!(a.status, 429, "the right password during a lockout: {}", a.body);
    let wait: u64 = a.headers["retry-after"].to_str().unwrap().parse().unwrap();
    let said = a.body["error"].as_str().unwrap();
    assert!(wait >= 1 && said.contains(&format!("{wait} s")), "{wait} s to wait, but: {said}");

    // Guesses sent all at once (fewer than an address's 32 connections), from another address:
    // each waits its turn to be checked and is checked against the lockout again then, so
    // only a few are tried (the first five, then one each time a lockout lapses: they last
    // 1 s, then twice as long after each failure), and the right password sent after the wave
    // is refused while the account is locked out.
    admin(&site.server)
        .args(["register-admin", "victim"])
        .write_stdin("victim-password\n")
        .assert()
        .success();
    let pem = fs::read(site.server.data.join("tls/cert.pem")).unwrap();
    let other = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .local_address("127.0.0.3".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let statuses: Vec<u16> = api.rt.block_on(async {
        let wave: Vec<_> = (0..24)
            .map(|i| {
                let body = json!({"name": "victim", "password": format!("guess-{i}")}).to_string();
                let request = other
                    .post(format!("{}/api/login", api.base))
                    .header("content-type", "application/json")
                    .body(body);
                tokio::spawn(async move { request.send().await.unwrap().status().as_u16() })
            })
            .collect();
        let mut statuses = Vec::new();
        for w in wave {
            statuses.push(w.await.unwrap());
        }
        statuses
    });
    let checked = statuses.iter().filter(|s| **s == 401).count();
    assert!(checked <= 12, "{checked} passwords checked of a wave of 24: {statuses:?}");
    let body = json!({"name": "victim", "password": "victim-password"}).to_string();
    let right = api.rt.block_on(
        other
            .post(format!("{}/api/login", api.base))
            .header("content-type", "application/json")
            .body(body)
            .send(),
    );
    assert_eq!(right.unwrap().status().as_u16(), 429, "after the wave: {statuses:?}");

    assert_eq!(api.login("nobody", "wrong-password", false).status, 401);
    // The console's page comes with a policy that forbids inline scripts and framing.
    let page = api.rt.block_on(api.http.get(&site.console).send()).unwrap();
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
}

/// ChromeDriver and a headless Chromium, through the WebDriver protocol.
struct Browser {
    driver: Child,
    api: reqwest::Client,
    rt: tokio::runtime::Runtime,
    base: String,
    session: String,
    /// Saved here if the test fails.
    failure_shot: PathBuf,
}

impl Browser {
    fn start(name: &str) -> Browser {
        let exe = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect(
                "no chromedriver: install Debian's chromium and chromium-driver (.ci/run does)",
            );
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = StdCommand::new(exe)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let api = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        wait_for("chromedriver", || {
            rt.block_on(api.get(format!("{base}/status")).send()).is_ok_and(|r| r.status() == 200)
        });
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("console-{name}.png"));
        let mut b = Browser { driver, api, rt, base, session: String::new(), failure_shot: target };
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "unhandledPromptBehavior": "accept",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless", "--no-sandbox", "--disable-gpu",
                         "--disable-background-networking", "--disable-dev-shm-usage",
                         "--window-size=1280,900"]
            }
        }}});
        let s = b.wd("POST", "/session", Some(caps));
        b.session = s["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {s}")).into();
        b
    }

    /// A WebDriver command; its `value`.
    fn wd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut r = self.api.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            r = r.header("content-type", "application/json").body(b.to_string());
        }
        let v: Value = self.rt.block_on(async {
            let answer = r.send().await.unwrap();
            serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap()
        });
        v["value"].clone()
    }

    fn cmd(&self, method: &str, what: &str, body: Value) -> Value {
        self.wd(method, &format!("/session/{}/{what}", self.session), Some(body))
    }

    fn go(&self, url: &str) {
        self.cmd("POST", "url", json!({ "url": url }));
    }

    /// Runs `script` in the page (its `arguments`), returns what it returns.
    fn js(&self, script: &str, args: Value) -> Value {
        self.cmd("POST", "execute/sync", json!({ "script": script, "args": args }))
    }

    /// The text of the first element `selector` matches, if any.
    fn text(&self, selector: &str) -> Option<String> {
        let v = self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
            json!([selector]),
        );
        v.as_str().map(str::to_owned)
    }

    fn wait_text(&self, selector: &str, contains: &str) -> String {
        let mut last = None;
        wait_for(&format!("{selector} to show {contains:?}"), || {
            last = self.text(selector);
            last.as_deref().is_some_and(|t| t.contains(contains))
        });
        last.unwrap_or_default()
    }

    fn element(&self, selector: &str) -> String {
        let v = self.cmd("POST", "element", json!({"using": "css selector", "value": selector}));
        let id = v.as_object().and_then(|o| o.values().next()).and_then(Value::as_str);
        id.unwrap_or_else(|| panic!("no element {selector}: {v}")).to_owned()
    }

    /// Types into an input, as a user would (keyboard events).
    fn type_into(&self, selector: &str, text: &str) {
        let e = self.element(selector);
        self.cmd("POST", &format!("element/{e}/clear"), json!({}));
        self.cmd("POST", &format!("element/{e}/value"), json!({ "text": text }));
    }

    fn click(&self, selector: &str) {
        let e = self.element(selector);
        self.cmd("POST", &format!("element/{e}/click"), json!({}));
    }

    /// Answers the page's `confirm()` with OK, as a user would.
    fn accept_confirmation(&self) {
        let mut text = Value::Null;
        wait_for("the confirmation", || {
            text = self.wd("GET", &format!("/session/{}/alert/text", self.session), None);
            text.is_string()
        });
        self.cmd("POST", "alert/accept", json!({}));
    }

    fn screenshot(&self, to: &Path) {
        let png = self.wd("GET", &format!("/session/{}/screenshot", self.session), None);
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::write(to, base64_decode(png.as_str().unwrap_or_default())).unwrap();
    }

    fn resize(&self, width: u32, height: u32) {
        self.cmd("POST", "window/rect", json!({"width": width, "height": height}));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.session.is_empty() {
            self.screenshot(&self.failure_shot.clone());
            eprintln!("the page as the test failed: {}", self.failure_shot.display());
        }
        if !self.session.is_empty() {
            let _ = self.rt.block_on(
                self.api.delete(format!("{}/session/{}", self.base, self.session)).send(),
            );
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let digits: Vec<u8> = text.bytes().filter_map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for group in digits.chunks(4) {
        let n =
            group.iter().enumerate().fold(0u32, |n, (i, d)| n | (u32::from(*d) << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..group.len()]);
    }
    out
}

#[test]
fn the_console_shows_a_backup_then_a_running_one_and_cancels_it() {
    let site = site();
    let b = Browser::start("backup-and-cancel");
    b.go(&site.console);
    b.type_into("#login-name", "oper");
    b.type_into("#login-password", "admin-password");
    b.click("#login-submit");
    b.wait_text("#whoami", "oper");
    // The overview: alpha, backed up moments before, is protected.
    b.wait_text("#node-status-table tr[data-node='alpha']", "protected");

    // A backup under way appears with its session, and the throughput chart moves.
    let big = site.src.parent().unwrap().join("big");
    big_tree(&big, 40);
    let backup = StdCommand::new(assert_cmd::cargo::cargo_bin("qsm"))
        .env("QSM_SERVER", &site.server.url)
        .env("QSM_NODE", "alpha")
        .env("QSM_PASSWORD_FILE", &site.alpha_pw)
        .env("QSM_CA", site.server.data.join("tls/cert.pem"))
        .env("QSM_HOME", "/nonexistent/embedded-must-not-be-used")
        .env("HOME", site.src.parent().unwrap())
        .args(["backup", "--compression", "off", "--limit-upload", "4MB", "--txn-group-max", "3"])
        .arg(&big)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    b.go(&format!("{}#/activity", site.console));
    let row = "#sessions-table tr[data-session-id]";
    let mut id = String::new();
    wait_for("alpha's session in the table", || {
        let v = b.js(
            "for (const r of document.querySelectorAll(arguments[0])) \
               if (r.textContent.includes('alpha')) return r.dataset.sessionId; return null;",
            json!([row]),
        );
        v.as_str().map(|s| id = s.to_owned()).is_some()
    });
    let series = "#throughput-chart path.series";
    let mut shapes = std::collections::BTreeSet::new();
    wait_for("the throughput chart to move", || {
        shapes.extend(
            b.js(
                "const p = document.querySelector(arguments[0]); return p && p.getAttribute('d');",
                json!([series]),
            )
            .as_str()
            .map(str::to_owned),
        );
        shapes.len() >= 3
    });
    let rate = b.text("#throughput-now").unwrap_or_default();
    assert!(rate.chars().any(|c| c.is_ascii_digit() && c != '0'), "rate shown: {rate:?}");
    screenshots(&b, &site, "activity");

    // Cancelled from the page (the confirmation accepted): the backup ends, refused.
    b.click(&format!("button[data-cancel-session='{id}']"));
    b.accept_confirmation();
    let out = backup.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the cancelled backup: {err}");
    assert!(err.contains("cancelled"), "{err}");
    wait_for("the session to leave the table", || {
        b.text(&format!("tr[data-session-id='{id}']")).is_none()
    });

    // The cancel is in the activity log, found by searching it.
    b.go(&format!("{}#/actlog", site.console));
    b.type_into("#actlog-search", "cancelled session");
    b.wait_text("#actlog-table", &format!("oper cancelled session {id}"));
    screenshots(&b, &site, "actlog");

    // Every page renders, with no error shown.
    for page in ["nodes", "events", "storage", "policy"] {
        b.go(&format!("{}#/{page}", site.console));
        b.wait_text(&format!("#page-{page}"), "");
        screenshots(&b, &site, page);
    }
    b.go(&format!("{}#/nodes/alpha", site.console));
    wait_for("the node's charts", || b.text("#chart-bytes").is_some());
    screenshots(&b, &site, "node");
    b.go(&site.console);
    b.wait_text("#node-status-table", "alpha");
    screenshots(&b, &site, "overview");
    let message = b.text("#message").unwrap_or_default();
    assert!(message.trim().is_empty(), "the console shows an error: {message}");

    // A node logs in to browse its own files, and sees nothing of the administrators'.
    b.click("#logout");
    b.wait_text("#login-form", "");
    b.type_into("#login-name", "alpha");
    b.type_into("#login-password", "alpha-password");
    b.click("#login-node");
    b.click("#login-submit");
    let src = site.src.to_str().unwrap();
    b.wait_text("#my-filespaces-table", src);
    let hidden = b.js("return document.querySelector('#nav').hidden;", json!([]));
    assert_eq!(hidden, true, "a node sees the administrators' pages");
    b.go(&format!("{}#/files?fs={}&dir=docs", site.console, url_encode(src)));
    b.wait_text("#files-table", "a.txt");
    let href = b.js("return document.querySelector('a[data-download]').href;", json!([]));
    assert!(href.as_str().unwrap().contains("/api/my/download?object="), "{href}");
    screenshots(&b, &site, "files");
}

/// With `QSM_CONSOLE_SCREENSHOTS=DIR`, saves the page as it is, wide and phone-sized, for
/// the README (`docs/console/`).
fn screenshots(b: &Browser, site: &Site, name: &str) {
    let Some(dir) = std::env::var_os("QSM_CONSOLE_SCREENSHOTS") else { return };
    let _ = site;
    let dir = PathBuf::from(dir);
    std::thread::sleep(Duration::from_millis(600));
    b.screenshot(&dir.join(format!("{name}.png")));
    b.resize(390, 844);
    std::thread::sleep(Duration::from_millis(600));
    b.screenshot(&dir.join(format!("{name}-phone.png")));
    b.resize(1280, 900);
}

/// Reads an answer's body as bytes.
fn bytes(api: &Api, token: &str, path: &str) -> (u16, Vec<u8>, reqwest::header::HeaderMap) {
    api.rt.block_on(async {
        let r = api
            .http
            .get(format!("{}{path}", api.base))
            .header("authorization", format!("Bearer {token}"))
            .send()
            .await
            .unwrap();
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        (status, r.bytes().await.unwrap().to_vec(), headers)
    })
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn a_node_browses_and_downloads_its_own_files_and_nothing_else() {
    let site = site();
    let api = Api::new(&site);
    let dir = site.src.parent().unwrap();
    // beta: encrypted on the client, a sparse file among its files.
    register(&site.server, "beta", "beta-password");
    let beta_pw = password_file(dir, "beta.pw", "beta-password");
    let pass = password_file(dir, "passphrase", "a passphrase for beta");
    let beta_src = dir.join("beta-src");
    fs::create_dir_all(&beta_src).unwrap();
    fs::write(beta_src.join("secret.txt"), b"beta's secret\n".repeat(100)).unwrap();
    client(&site.server, "beta", &beta_pw)
        .env("QSM_PASSPHRASE_FILE", &pass)
        .env("QSM_KEY_FILE", dir.join("beta.key"))
        .args(["backup", "--encryption", "on"])
        .arg(&beta_src)
        .assert()
        .success();
    // alpha's second tree: a sparse file, a hard link, a name to escape.
    let more = dir.join("more");
    fs::create_dir_all(more.join("sub")).unwrap();
    let sparse = fs::File::create(more.join("sparse")).unwrap();
    sparse.set_len(5_000_000).unwrap();
    use std::io::{Seek, SeekFrom, Write as _};
    let mut f = &sparse;
    f.seek(SeekFrom::Start(2_000_000)).unwrap();
    f.write_all(&b"data in the middle".repeat(1000)).unwrap();
    drop(sparse);
    fs::write(more.join("sub/x y\"z.txt"), b"quoted name\n").unwrap();
    fs::hard_link(more.join("sub/x y\"z.txt"), more.join("sub/linked")).unwrap();
    client(&site.server, "alpha", &site.alpha_pw).arg("backup").arg(&more).assert().success();

    let alpha = api.token("alpha", "alpha-password", true);
    let beta = api.token("beta", "beta-password", true);
    let admin = api.token("sysadm", "admin-password", false);
    let src = site.src.to_str().unwrap();
    let fs_of = |token: &str| -> Vec<String> {
        let a = api.as_(Some(token), "GET", "/api/my/filespaces", None);
        assert_eq!(a.status, 200, "{}", a.body);
        a.body.as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(fs_of(&alpha).len(), 2);
    assert_eq!(fs_of(&beta), [beta_src.to_str().unwrap()]);

    // alpha's root, then a directory: direct children only, in name order.
    let list = |token: &str, fs: &str, d: &str| {
        api.as_(
            Some(token),
            "GET",
            &format!("/api/my/files?filespace={}&dir={}", url_encode(fs), url_encode(d)),
            None,
        )
    };
    let root = list(&alpha, src, "").body;
    let names: Vec<&str> =
        root["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["docs", "empty", "link"], "{root}");
    let docs = list(&alpha, src, "docs").body;
    let entries = docs["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{docs}");
    assert_eq!(
        (entries[0]["name"].clone(), entries[0]["type"].clone()),
        (json!("a.txt"), json!("file"))
    );
    assert_eq!(entries[1]["type"], "directory", "{docs}");
    assert_eq!(root["entries"][2]["link_target"], "docs/a.txt", "{root}");

    // A file, byte for byte, with its name in the header.
    let id = entries[0]["object"].as_i64().unwrap();
    let (status, body, headers) = bytes(&api, &alpha, &format!("/api/my/download?object={id}"));
    assert_eq!(status, 200);
    assert_eq!(body, fs::read(site.src.join("docs/a.txt")).unwrap());
    assert!(headers["content-disposition"].to_str().unwrap().contains("a.txt"));
    // The sparse file, holes as zeros, the right length.
    let more_fs = more.to_str().unwrap();
    let top = list(&alpha, more_fs, "").body;
    let sparse_id = top["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "sparse")
        .unwrap()["object"]
        .as_i64()
        .unwrap();
    let (_, body, _) = bytes(&api, &alpha, &format!("/api/my/download?object={sparse_id}"));
    assert!(body == fs::read(more.join("sparse")).unwrap(), "the sparse file differs");

    // A directory as tar, as `tar -x` reads it: contents, hard link, odd names.
    let (status, tar, _) =
        bytes(&api, &alpha, &format!("/api/my/tar?filespace={}&dir=", url_encode(more_fs)));
    assert_eq!(status, 200);
    let out = dir.join("untarred");
    fs::create_dir_all(&out).unwrap();
    let tarfile = dir.join("more.tar");
    fs::write(&tarfile, &tar).unwrap();
    let x = StdCommand::new("tar").arg("-xf").arg(&tarfile).arg("-C").arg(&out).output().unwrap();
    assert!(x.status.success(), "{}", String::from_utf8_lossy(&x.stderr));
    assert_same(&more, &out.join("more"));
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    assert_eq!(ino(&out.join("more/sub/linked")), ino(&out.join("more/sub/x y\"z.txt")));
    let (status, tar, _) =
        bytes(&api, &alpha, &format!("/api/my/tar?filespace={}&dir=docs", url_encode(src)));
    assert_eq!(status, 200);
    let out = dir.join("untarred-docs");
    fs::create_dir_all(&out).unwrap();
    fs::write(dir.join("docs.tar"), &tar).unwrap();
    let x = StdCommand::new("tar")
        .arg("-xf")
        .arg(dir.join("docs.tar"))
        .arg("-C")
        .arg(&out)
        .output()
        .unwrap();
    assert!(x.status.success());
    assert_same(&site.src.join("docs"), &out.join("docs"));

    // beta's files are encrypted on its client: listed, never served, and said so.
    let bfs = beta_src.to_str().unwrap();
    let b = list(&beta, bfs, "").body;
    assert_eq!(b["entries"][0]["encrypted"], true, "{b}");
    let bid = b["entries"][0]["object"].as_i64().unwrap();
    let a = api.as_(Some(&beta), "GET", &format!("/api/my/download?object={bid}"), None);
    assert_eq!(a.status, 409, "{}", a.body);
    assert!(a.body["error"].as_str().unwrap().contains("encrypted"), "{}", a.body);
    let a =
        api.as_(Some(&beta), "GET", &format!("/api/my/tar?filespace={}", url_encode(bfs)), None);
    assert_eq!(a.status, 409, "{}", a.body);

    // Each node only its own: the other's objects and filespaces do not exist for it, on
    // every endpoint; an administrator's session is not a node's.
    for (who, path) in [
        (&alpha, format!("/api/my/download?object={bid}")),
        (&alpha, format!("/api/my/files?filespace={}", url_encode(bfs))),
        (&alpha, format!("/api/my/tar?filespace={}", url_encode(bfs))),
        (&beta, format!("/api/my/download?object={id}")),
        (&beta, format!("/api/my/download?object={sparse_id}")),
        (&beta, format!("/api/my/files?filespace={}", url_encode(src))),
        (&beta, format!("/api/my/tar?filespace={}&dir=docs", url_encode(src))),
    ] {
        let a = api.as_(Some(who), "GET", &path, None);
        assert_eq!(a.status, 404, "{path}: {}", a.body);
    }
    for path in ["/api/my/filespaces", &format!("/api/my/download?object={id}")] {
        assert_eq!(api.as_(Some(&admin), "GET", path, None).status, 403, "{path}");
        assert_eq!(api.as_(None, "GET", path, None).status, 401, "{path}");
    }
    // Bad input: named, never a 500.
    for (path, status) in [
        (format!("/api/my/files?filespace={}&dir=../etc", url_encode(src)), 400),
        (format!("/api/my/files?filespace={}&dir=/docs", url_encode(src)), 400),
        (format!("/api/my/files?filespace={}&dir=nowhere", url_encode(src)), 200),
        ("/api/my/files".to_owned(), 400),
        ("/api/my/download?object=abc".to_owned(), 400),
        ("/api/my/download?object=-5".to_owned(), 404),
        (format!("/api/my/download?object={}", docs["entries"][1]["object"]), 409),
        (format!("/api/my/tar?filespace={}&dir=nowhere", url_encode(src)), 404),
    ] {
        let a = api.as_(Some(&alpha), "GET", &path, None);
        assert_eq!(a.status, status, "{path}: {}", a.body);
    }
}
