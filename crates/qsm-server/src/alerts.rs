//! Alerts (`[[alert]]` in server.toml, issue 26): webhooks told, as JSON, what an
//! administrator must not learn from a user: a backup that failed or a scheduled one that
//! was missed, damaged chunks an audit
//! found, a pool's file system nearly full. Sending never holds up what raised the alert: an
//! alert is queued, and a task posts it to every webhook that asked for its kind, retrying
//! with back-off, each delivery or give-up written to the activity log.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use qsm_catalog::{NodeId, Severity};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::state::State;

/// A webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertConfig {
    /// Where alerts are posted: `http://` or `https://` (checked against the system's
    /// trusted certificates).
    pub url: String,
    /// The kinds of alert to send (default: every kind).
    #[serde(default = "every_kind")]
    pub events: Vec<String>,
}

/// The kinds of alert.
pub const KINDS: [&str; 5] = ["failed", "missed", "damaged", "pool-full", "suspect"];

fn every_kind() -> Vec<String> {
    KINDS.iter().map(|k| (*k).to_owned()).collect()
}

impl AlertConfig {
    /// Refuses a URL that is not HTTP and a kind that does not exist.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://"))
            || self.url.parse::<reqwest::Url>().is_err()
        {
            return Err(format!(
                "alert url {:?}: write http://HOST[:PORT]/PATH or https://…",
                self.url
            ));
        }
        if let Some(k) = self.events.iter().find(|k| !KINDS.contains(&k.as_str())) {
            return Err(format!(
                "alert {}: no event {k:?}; the events are {}",
                self.url,
                KINDS.join(", ")
            ));
        }
        Ok(())
    }
}

/// One alert: what a webhook receives, as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alert {
    /// Its kind, one of [`KINDS`].
    pub event: &'static str,
    /// The server that raised it.
    pub server: String,
    /// When, in seconds since the epoch.
    pub time: i64,
    /// What happened, as the activity log says it.
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

/// Attempts per webhook and alert: the first, then retries after 1, 2, 4, 8 and 16 s.
const ATTEMPTS: u32 = 6;
/// How long one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Alerts waiting to be sent at most; beyond, new ones are dropped (and said).
const QUEUE: usize = 1000;
/// Deliveries under way at most: a burst of alerts (a node whose backups fail in a loop) waits
/// in the queue instead of becoming as many connections.
const SENDING: usize = 16;

/// The queue of alerts to send.
#[derive(Debug)]
pub struct Alerts {
    hooks: Vec<AlertConfig>,
    queue: mpsc::Sender<Alert>,
    /// Taken by [`deliver`] when the server starts; an embedded server never takes it, and
    /// has no webhooks to send to.
    receiver: std::sync::Mutex<Option<mpsc::Receiver<Alert>>>,
    /// The pool's file system is past its threshold (said once until it is below again).
    pub pool_full: AtomicBool,
    /// Deliveries under way.
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

impl Alerts {
    /// The queue for `hooks`.
    pub fn new(hooks: Vec<AlertConfig>) -> Alerts {
        let (queue, receiver) = mpsc::channel(QUEUE);
        Alerts {
            hooks,
            queue,
            receiver: std::sync::Mutex::new(Some(receiver)),
            pool_full: AtomicBool::new(false),
            in_flight: Arc::default(),
        }
    }

    /// Whether some webhook wants alerts of `kind`.
    pub fn wanted(&self, kind: &str) -> bool {
        self.hooks.iter().any(|h| h.events.iter().any(|e| e == kind))
    }

    /// Queues `alert` for the webhooks (`State::alert` has checked that one wants its kind);
    /// never waits.
    fn raise(&self, alert: Alert) {
        match self.queue.try_send(alert) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(a)) => {
                let _ = writeln_stderr(&format!(
                    "alert {} dropped: {QUEUE} alerts are waiting to be sent",
                    a.event
                ));
            }
            Err(mpsc::error::TrySendError::Closed(a)) => {
                let _ = writeln_stderr(&format!(
                    "alert {} not sent: the server is stopping: {}",
                    a.event, a.message
                ));
            }
        }
    }

    /// Whether alerts are waiting or being sent.
    pub fn sending(&self) -> bool {
        self.queue.capacity() < QUEUE || self.in_flight.load(Ordering::Relaxed) > 0
    }
}

fn writeln_stderr(line: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    writeln!(std::io::stderr(), "qsm server: warning: {line}")
}

/// Posts the queued alerts until the server stops: each to every webhook that wants it, each
/// delivery on its own task so one slow webhook delays no other.
pub async fn deliver(state: Arc<State>) {
    let Some(mut receiver) = state.alerts.receiver.lock().unwrap_or_else(|p| p.into_inner()).take()
    else {
        return;
    };
    let client = match reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln_stderr(&format!("no alerts can be sent: {e}"));
            return;
        }
    };
    let sending = Arc::new(tokio::sync::Semaphore::new(SENDING));
    while let Some(alert) = receiver.recv().await {
        let body = match serde_json::to_vec(&alert) {
            Ok(b) => b,
            Err(_) => continue,
        };
        for hook in state.alerts.hooks.iter().filter(|h| h.events.iter().any(|e| e == alert.event))
        {
            let Ok(slot) = Arc::clone(&sending).acquire_owned().await else { return };
            let (client, state, body) = (client.clone(), Arc::clone(&state), body.clone());
            let (url, event) = (hook.url.clone(), alert.event);
            let in_flight = Arc::clone(&state.alerts.in_flight);
            in_flight.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let _slot = slot;
                // A webhook's URL often holds its secret: the log names its host only.
                let to = where_to(&url);
                let outcome = post(&client, &url, body).await;
                let (severity, message) = match outcome {
                    Ok(attempts) => {
                        (Severity::Info, format!("alert {event} sent to {to} (attempt {attempts})"))
                    }
                    Err(e) => (
                        Severity::Warning,
                        format!(
                            "alert {event} not delivered to {to} after {ATTEMPTS} attempts: {e}"
                        ),
                    ),
                };
                let _ =
                    tokio::task::spawn_blocking(move || state.log(severity, &message, None, None))
                        .await;
                in_flight.fetch_sub(1, Ordering::Relaxed);
            });
        }
    }
}

/// A webhook named without its path or query, which may hold a secret.
fn where_to(url: &str) -> String {
    match url.parse::<reqwest::Url>() {
        Ok(u) => format!(
            "{}://{}{}",
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.port().map(|p| format!(":{p}")).unwrap_or_default()
        ),
        Err(_) => "a webhook".into(),
    }
}

/// Posts `body` to `url` until it is taken (a 2xx answer), with back-off between attempts;
/// the attempt that succeeded, or the last error.
async fn post(client: &reqwest::Client, url: &str, body: Vec<u8>) -> Result<u32, String> {
    let mut wait = Duration::from_secs(1);
    let mut last = String::new();
    for attempt in 1..=ATTEMPTS {
        let sent = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => return Ok(attempt),
            Ok(r) => last = format!("the webhook answered {}", r.status()),
            // Its URL left out: it may hold the webhook's secret.
            Err(e) => last = qsm_types::error_chain(&e.without_url()),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
    }
    Err(last)
}

impl State {
    /// Raises an alert of `event` with `message`, about `node`'s `filespace` or `pool`.
    pub fn alert(
        &self,
        event: &'static str,
        message: &str,
        node: Option<NodeId>,
        filespace: Option<&str>,
        pool: Option<&str>,
    ) {
        if !self.alerts.wanted(event) {
            return;
        }
        let node = node.and_then(|id| {
            let nodes = self.store.catalog().nodes().ok()?;
            nodes.into_iter().find(|n| n.id == id).map(|n| n.name)
        });
        self.alerts.raise(Alert {
            event,
            server: self.name.clone(),
            time: qsm_types::now(),
            message: message.to_owned(),
            node,
            filespace: filespace.map(str::to_owned),
            pool: pool.map(str::to_owned),
        });
    }

    /// Checks how full the pool's file system is (a directory pool), raising `pool-full`
    /// when it passes `pool_full_percent` and again only after it fell 5 points below.
    pub fn check_pool_space(&self) {
        if !self.alerts.wanted("pool-full") || self.config.s3.is_some() {
            return;
        }
        let path = self.config.pool_path();
        let Ok(fs) = rustix::fs::statvfs(&path) else { return };
        let total = fs.f_blocks.saturating_mul(fs.f_frsize);
        if total == 0 {
            return;
        }
        let free = fs.f_bavail.saturating_mul(fs.f_frsize);
        let used = 100.0 - free as f64 * 100.0 / total as f64;
        let limit = f64::from(self.config.pool_full_percent);
        let full = &self.alerts.pool_full;
        if used >= limit && !full.swap(true, Ordering::Relaxed) {
            let message = format!(
                "the file system of the storage pool {} is {used:.0}% full ({} bytes free): \
                 backups fail when it is full",
                path.display(),
                free
            );
            self.log(Severity::Warning, &message, None, None);
            self.alert("pool-full", &message, None, None, Some(&path.display().to_string()));
        } else if used < limit - 5.0 {
            full.store(false, Ordering::Relaxed);
        }
    }
}
