//! Prometheus metrics (`--metrics-listen`, issue 26): what a monitoring system needs to see
//! that every filespace was backed up lately and that the server is healthy, in the
//! Prometheus text format 0.0.4. The values are read when scraped: this server's
//! sessions, processes and counters from memory, filespaces and pools from the catalog (so
//! every server sharing a catalog reports the same filespaces; `qsm_server_*` say which
//! server answered).

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use qsm_catalog::RunResult;
use qsm_types::ServerError;

use crate::admin_core::{Actor, AdminSession};
use crate::node_core::catalog_error;
use crate::state::State;

/// What the server counts from its start, for the `_total` counters.
#[derive(Debug, Default)]
pub struct Counters {
    pub logins_succeeded: AtomicU64,
    pub logins_failed: AtomicU64,
    /// Frame bytes received from clients.
    pub received_bytes: AtomicU64,
    /// Backups ended, by result (in `RunResult::ALL`'s order).
    pub backups: [AtomicU64; RunResult::ALL.len()],
    /// How long requests took.
    pub latencies: Latencies,
}

impl Counters {
    /// Counts a backup that ended `result`.
    pub fn backup_ended(&self, result: RunResult) {
        if let Some(i) = RunResult::ALL.iter().position(|r| *r == result) {
            self.backups[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A sample's labels, in order.
pub type Labels = Vec<(String, String)>;

/// Labels from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    /// Its name ends in `_total`.
    Counter,
}

/// Metrics in the Prometheus text exposition format 0.0.4: what Prometheus scrapes,
/// node_exporter's textfile collector reads and `promtool check metrics` checks. (The
/// OpenMetrics text of the `prometheus-client` crate names a counter's family without its
/// `_total`, which promtool and node_exporter's parser take for a family without help.)
#[derive(Debug, Default)]
pub struct Exposition(String);

/// HELP text as the format wants it: backslashes and newlines escaped.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The content type of [`Exposition::text`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Exposition {
    /// Adds the family `name` (with its unit suffix, `_seconds`, `_bytes`; a counter's ending
    /// in `_total`) and its samples.
    pub fn family(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, f64)>,
    ) {
        let out = &mut self.0;
        let help = escape_help(help);
        let kind = match kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self.samples(name, samples);
    }

    /// Adds samples of `name`, each a line.
    fn samples(&mut self, name: &str, samples: impl IntoIterator<Item = (Labels, f64)>) {
        let out = &mut self.0;
        for (labels, value) in samples {
            out.push_str(name);
            if !labels.is_empty() {
                let pairs: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| {
                        let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                        format!("{k}=\"{v}\"")
                    })
                    .collect();
                let _ = write!(out, "{{{}}}", pairs.join(","));
            }
            let value = if value.is_nan() {
                "NaN".to_owned()
            } else if value.is_infinite() {
                if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
            } else {
                value.to_string()
            };
            let _ = writeln!(out, " {value}");
        }
    }

    /// The exposition.
    pub fn text(self) -> String {
        self.0
    }
}

/// The metrics as Prometheus scrapes them.
pub fn render(state: &State) -> Result<String, ServerError> {
    use Kind::{Counter, Gauge};
    let mut x = Exposition::default();
    // What the catalog says is read through the administrative core, as `qsm admin query`
    // reads it: one implementation of each listing.
    let core = AdminSession::new(state, Actor::Owner("the metrics endpoint".into()));
    let admin = qsm_proto::Admin(&core);

    // Backups: what an alert on a missed backup reads is the last completed one's end.
    let mut ok: [Vec<(Labels, f64)>; 5] = Default::default();
    let mut run: [Vec<(Labels, f64)>; 2] = Default::default();
    let mut newest = std::collections::BTreeMap::<String, i64>::new();
    for f in admin.filespaces(None)? {
        let l = labels(&[("node", &f.node), ("filespace", &f.name)]);
        if let Some(c) = f.last_completed {
            let values = [
                c.ended as f64,
                (c.ended - c.started).max(0) as f64,
                c.bytes as f64,
                c.objects as f64,
                c.warnings as f64,
            ];
            for (list, v) in ok.iter_mut().zip(values) {
                list.push((l.clone(), v));
            }
            let t = newest.entry(f.node.clone()).or_insert(c.ended);
            *t = (*t).max(c.ended);
        }
        if let Some(r) = f.last_backup {
            run[0].push((l.clone(), r.ended as f64));
            run[1].push((l, f64::from(u8::from(r.result == RunResult::Failed.name()))));
        }
    }
    let node_last = newest.into_iter().map(|(node, t)| (labels(&[("node", &node)]), t as f64));
    let [ended, took, bytes, objects, skipped] = ok;
    let last = "the filespace's last completed backup (with or without warnings)";
    x.family(
        "qsm_filespace_last_backup_timestamp_seconds",
        Gauge,
        &format!("When {last} ended."),
        ended,
    );
    x.family(
        "qsm_filespace_last_backup_duration_seconds",
        Gauge,
        &format!("How long {last} took."),
        took,
    );
    x.family(
        "qsm_filespace_last_backup_stored_bytes",
        Gauge,
        &format!("Frame bytes {last} stored."),
        bytes,
    );
    x.family(
        "qsm_filespace_last_backup_objects",
        Gauge,
        &format!("Objects {last} stored."),
        objects,
    );
    x.family(
        "qsm_filespace_last_backup_skipped_files",
        Gauge,
        &format!("Files {last} skipped or could not read whole."),
        skipped,
    );
    let [run_ended, run_failed] = run;
    x.family(
        "qsm_filespace_last_run_timestamp_seconds",
        Gauge,
        "When the filespace's last backup ended, however it ended.",
        run_ended,
    );
    x.family(
        "qsm_filespace_last_run_failed",
        Gauge,
        "1 if the filespace's last backup failed, else 0.",
        run_failed,
    );
    x.family(
        "qsm_node_last_backup_timestamp_seconds",
        Gauge,
        "When the node's most recent completed backup of any of its filespaces ended.",
        node_last,
    );

    // Storage.
    let mut pools: [Vec<(Labels, f64)>; 5] = Default::default();
    for u in admin.stgpools()? {
        let l = labels(&[("pool", &u.name)]);
        let values = [
            u.containers as f64,
            u.bytes as f64,
            u.live_bytes as f64,
            u.bytes.saturating_sub(u.live_bytes) as f64,
            u.damaged_chunks as f64,
        ];
        for (list, v) in pools.iter_mut().zip(values) {
            list.push((l.clone(), v));
        }
    }
    let [containers, size, live, reclaimable, damaged] = pools;
    x.family("qsm_pool_containers", Gauge, "Containers in the storage pool.", containers);
    x.family("qsm_pool_size_bytes", Gauge, "Bytes of the pool's containers.", size);
    x.family("qsm_pool_live_bytes", Gauge, "Bytes of the chunks versions reference.", live);
    x.family(
        "qsm_pool_reclaimable_bytes",
        Gauge,
        "Bytes of chunks no version references any more: what reclamation can free.",
        reclaimable,
    );
    x.family("qsm_pool_damaged_chunks", Gauge, "Chunks an audit found damaged.", damaged);
    let stats = state.store.catalog().stats().map_err(catalog_error)?;
    let one = |v: u64| [(Labels::new(), v as f64)];
    x.family(
        "qsm_catalog_size_bytes",
        Gauge,
        "Bytes the catalog's database occupies.",
        one(stats.database_bytes),
    );
    x.family("qsm_catalog_objects", Gauge, "Object versions in the catalog.", one(stats.objects));

    // Holds by kind, zero included: `qsm_holds{kind="suspect"} > 0` is a backup that looks
    // like ransomware, its filespace's versions kept until an administrator acknowledges.
    let mut holds: std::collections::BTreeMap<&str, f64> =
        [("hold", 0.0), ("suspect", 0.0)].into_iter().collect();
    for h in state.store.catalog().holds().map_err(catalog_error)? {
        *holds.entry(h.kind.name()).or_default() += 1.0;
    }
    x.family(
        "qsm_holds",
        Gauge,
        "Holds on nodes and filespaces, by kind: an administrator's (hold), or a suspect backup's \
         not yet acknowledged (suspect).",
        holds.into_iter().map(|(kind, n)| (labels(&[("kind", kind)]), n)),
    );

    // Schedules' events of the last day, by state (every state, zero included, so that an
    // alert on `missed` or `failed` has a series to read).
    let mut states: std::collections::BTreeMap<String, f64> =
        qsm_types::model::EVENT_STATES.iter().map(|s| ((*s).to_owned(), 0.0)).collect();
    // The events run, not the next windows `query event` adds as `future`.
    for e in admin.events(None, Some(qsm_types::now() - 86_400))? {
        if e.state != "future" {
            *states.entry(e.state).or_default() += 1.0;
        }
    }
    x.family(
        "qsm_events_last_day",
        Gauge,
        "Schedules' events of windows that began in the last 24 hours, by state.",
        states.into_iter().map(|(state, n)| (labels(&[("state", &state)]), n)),
    );

    // This server: its sessions, processes and counters.
    let here = |pairs: &[(&str, &str)]| {
        let mut l = labels(&[("server", &state.name)]);
        l.extend(labels(pairs));
        l
    };
    let sessions = state.sessions.list();
    let nodes = sessions.iter().filter(|s| s.node.is_some()).count();
    let open = [
        (here(&[("kind", "node")]), nodes as f64),
        (here(&[("kind", "admin")]), (sessions.len() - nodes) as f64),
    ];
    x.family("qsm_server_sessions", Gauge, "Sessions open on this server.", open);
    let mut by_kind = std::collections::BTreeMap::<String, f64>::new();
    for (_, kind, _, _) in state.processes.list() {
        *by_kind.entry(kind).or_default() += 1.0;
    }
    let processes = by_kind.into_iter().map(|(kind, n)| (here(&[("kind", &kind)]), n));
    x.family("qsm_server_processes", Gauge, "Processes running on this server.", processes);
    // Each session's bytes: rate() of it is the session's throughput.
    let received = sessions.iter().filter(|s| s.node.is_some()).map(|s| {
        let id = s.id.to_string();
        (here(&[("session", &id), ("node", &s.account)]), s.bytes.load(Ordering::Relaxed) as f64)
    });
    x.family(
        "qsm_session_received_bytes_total",
        Counter,
        "Frame bytes each open node session has sent this server.",
        received,
    );
    // How long each process has run (its progress in words: `qsm admin query process`).
    let now = qsm_types::now();
    let elapsed = state.processes.list().into_iter().map(|(id, kind, started, _)| {
        let id = id.to_string();
        (here(&[("process", &id), ("kind", &kind)]), (now - started).max(0) as f64)
    });
    x.family(
        "qsm_server_process_elapsed_seconds",
        Gauge,
        "How long each process running on this server has run.",
        elapsed,
    );
    let c = &state.counters;
    let count = |v: &AtomicU64| v.load(Ordering::Relaxed) as f64;
    x.family(
        "qsm_server_logins_total",
        Counter,
        "Logins to this server since it started, by result.",
        [
            (here(&[("result", "succeeded")]), count(&c.logins_succeeded)),
            (here(&[("result", "failed")]), count(&c.logins_failed)),
        ],
    );
    x.family(
        "qsm_server_received_bytes_total",
        Counter,
        "Frame bytes clients sent to this server since it started.",
        [(here(&[]), count(&c.received_bytes))],
    );
    x.family(
        "qsm_server_backups_total",
        Counter,
        "Backups that ended on this server since it started, by result.",
        RunResult::ALL
            .iter()
            .zip(&c.backups)
            .map(|(r, n)| (here(&[("result", r.name())]), count(n))),
    );
    let latencies: Vec<(Labels, Histogram)> = c
        .latencies
        .snapshot()
        .into_iter()
        .map(|(method, h)| (here(&[("method", &method)]), h))
        .collect();
    x.histogram(
        "qsm_server_request_duration_seconds",
        "How long this server took to answer requests, by gRPC method (a stream: until its \
         response began).",
        &latencies,
    );
    Ok(x.text())
}

/// How long a rendering of the metrics is served again.
const RENDER_KEPT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves `/metrics` on `addr` until `stopped` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    use axum::http::{StatusCode, header};
    // One rendering at a time, kept a few seconds: a scrape reads the whole catalog's
    // counts, and several scrapers (or a hostile client) must not multiply that.
    let cache: Arc<std::sync::Mutex<Option<(std::time::Instant, String)>>> = Arc::default();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (state, cache) = (Arc::clone(&state), Arc::clone(&cache));
            async move {
                let rendered = tokio::task::spawn_blocking(move || {
                    let mut kept = cache.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some((at, text)) = kept.as_ref()
                        && at.elapsed() < RENDER_KEPT
                    {
                        return Ok::<String, ServerError>(text.clone());
                    }
                    let text = render(&state)?;
                    *kept = Some((std::time::Instant::now(), text.clone()));
                    Ok(text)
                })
                .await;
                match rendered {
                    Ok(Ok(text)) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], text),
                    Ok(Err(e)) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                        format!("qsm: cannot read the metrics: {e}\n"),
                    ),
                    Err(e) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                        format!("qsm: the metrics failed: {e}\n"),
                    ),
                }
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(stopped)
        .await
        .map_err(|e| ServerError::Failed(format!("the metrics listener failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_in_their_buckets_and_made_up_methods_stay_bounded() {
        let l = Latencies::default();
        l.observe("/qsm.v1.Node/Login", true, 0.003);
        l.observe("/qsm.v1.Node/Login", true, 20.0);
        for i in 0..500 {
            l.observe(&format!("/qsm.v1.Node/Made{i}"), false, 0.0);
        }
        l.observe("/not/ours", true, 0.0);
        for i in 0..500 {
            l.observe(&format!("/qsm.v1.Admin/Op{i}"), true, 0.0);
        }
        let all = l.snapshot();
        assert!(all.len() <= MAX_METHODS + 1, "{} methods", all.len());
        let login = &all.iter().find(|(m, _)| m == "Login").unwrap().1;
        assert_eq!((login.count, login.buckets[1], login.buckets[2]), (2, 0, 1));
        assert_eq!(login.buckets[LATENCY_BUCKETS.len() - 1], 1, "20 s is only in +Inf");
        assert!(all.iter().any(|(m, h)| m == "other" && h.count >= 2));
    }

    #[test]
    fn the_exposition_escapes_what_the_format_reserves() {
        let mut x = Exposition::default();
        x.family(
            "qsm_x_total",
            Kind::Counter,
            "a \\ help\nline",
            [(labels(&[("filespace", "/a \"b\"\\c\nd"), ("node", "n")]), 3.0)],
        );
        x.family("qsm_y", Kind::Gauge, "y", [(Labels::new(), f64::INFINITY), (Labels::new(), 0.5)]);
        assert_eq!(
            x.text(),
            "# HELP qsm_x_total a \\\\ help\\nline\n# TYPE qsm_x_total counter\n\
             qsm_x_total{filespace=\"/a \\\"b\\\"\\\\c\\nd\",node=\"n\"} 3\n\
             # HELP qsm_y y\n# TYPE qsm_y gauge\nqsm_y +Inf\nqsm_y 0.5\n"
        );
    }
}

/// The upper bounds (seconds) of the request-latency histogram's buckets.
const LATENCY_BUCKETS: [f64; 12] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
/// Methods tracked apart at most: a peer naming made-up methods cannot grow the label set.
const MAX_METHODS: usize = 80;

/// How long requests took, by gRPC method (for a streaming call: until its response began).
#[derive(Debug, Default)]
pub struct Latencies(std::sync::Mutex<std::collections::BTreeMap<String, Histogram>>);

/// One method's requests: how many fell at or below each bucket's bound, their sum and count.
#[derive(Debug, Default, Clone)]
pub struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Latencies {
    /// Counts a request to `path` (`/qsm.v1.Node/Login`) that took `seconds`; `served`
    /// false when the server has no such method (its answer was UNIMPLEMENTED), so made-up
    /// names never take a place of their own.
    pub fn observe(&self, path: &str, served: bool, seconds: f64) {
        let method = path.rsplit('/').next().unwrap_or_default();
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let known = served && path.starts_with("/qsm.v1.") && !method.is_empty();
        let key = if known && (map.contains_key(method) || map.len() < MAX_METHODS) {
            method
        } else {
            "other"
        };
        let h = map.entry(key.to_owned()).or_default();
        for (bucket, bound) in h.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        h.sum += seconds;
        h.count += 1;
    }

    fn snapshot(&self) -> Vec<(String, Histogram)> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl Exposition {
    /// Adds the histogram family `name` (its `_bucket`, `_sum` and `_count` series).
    pub fn histogram(&mut self, name: &str, help: &str, series: &[(Labels, Histogram)]) {
        let mut buckets = Vec::new();
        let mut sums = Vec::new();
        let mut counts = Vec::new();
        for (labels, h) in series {
            for (bound, n) in LATENCY_BUCKETS.iter().zip(h.buckets) {
                let mut l = labels.clone();
                l.push(("le".into(), bound.to_string()));
                buckets.push((l, n as f64));
            }
            let mut l = labels.clone();
            l.push(("le".into(), "+Inf".into()));
            buckets.push((l, h.count as f64));
            sums.push((labels.clone(), h.sum));
            counts.push((labels.clone(), h.count as f64));
        }
        let help = escape_help(help);
        let out = &mut self.0;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut part = Exposition::default();
        part.samples(&format!("{name}_bucket"), buckets);
        part.samples(&format!("{name}_sum"), sums);
        part.samples(&format!("{name}_count"), counts);
        self.0.push_str(&part.0);
    }
}

/// A tower layer timing every request of the services it wraps into [`Latencies`].
#[derive(Debug, Clone)]
pub struct Timed(pub Arc<State>);

impl<S> tower::Layer<S> for Timed {
    type Service = TimedService<S>;

    fn layer(&self, inner: S) -> TimedService<S> {
        TimedService { inner, state: Arc::clone(&self.0) }
    }
}

/// A service whose requests are timed (see [`Timed`]).
#[derive(Debug, Clone)]
pub struct TimedService<S> {
    inner: S,
    state: Arc<State>,
}

impl<S, B, R> tower::Service<axum::http::Request<B>> for TimedService<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let path = request.uri().path().to_owned();
        let started = std::time::Instant::now();
        let answer = self.inner.call(request);
        let state = Arc::clone(&self.state);
        Box::pin(async move {
            let answered = answer.await;
            // gRPC's UNIMPLEMENTED (12), in the headers of an answer without a body.
            let served = answered.as_ref().is_ok_and(|r| {
                r.headers().get("grpc-status").is_none_or(|s| s.as_bytes() != b"12")
            });
            state.counters.latencies.observe(&path, served, started.elapsed().as_secs_f64());
            answered
        })
    }
}
