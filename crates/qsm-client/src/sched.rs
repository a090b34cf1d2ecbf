//! The client scheduler (`qsm sched`, issue 26; TSM's client scheduler in polling mode): a
//! long-running process that asks its server for the node's schedules, starts each due one
//! at a random moment early in its window (so a fleet does not start all at once), runs the
//! backup or archive as a child `qsm` process with the node's own options, and reports the
//! outcome as the event's.
//!
//! - It survives server restarts and network loss: it connects again with growing waits, and
//!   an outcome it could not report is reported once the server answers (the server severs an
//!   event whose node has no session left, so one never stays "started").
//! - It runs one action at a time, and holds a lock so that two schedulers of one node on one
//!   machine never run at once: no filespace is backed up twice at the same time by them.
//! - `pre_command` runs before the action (TSM's PRESCHEDULECMD): if it fails, the event
//!   fails and the action is skipped. `post_command` always runs after; if it fails, a
//!   completed event is completed with warnings.
//!
//! The child is the same `qsm` binary, so a scheduled backup is exactly the backup a user
//! runs by hand, with the same option precedence and the same summary.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use qsm_types::ServerError;
use qsm_types::model::RunResult;
use qsm_types::node::Due;

use crate::error::{ClientError, Result};
use crate::server::Server;

/// How the scheduler works.
#[derive(Debug, Clone)]
pub struct SchedOptions {
    /// How often the server is asked again while nothing is due sooner: a schedule changed or
    /// associated meanwhile is seen within this.
    pub poll: Duration,
    /// The part of each window, from its start, over which runs are spread (TSM's RANDOMIZE;
    /// 0.25 by default, as TSM's).
    pub spread: f64,
    /// Run before each action through `sh -c`; a failure fails the event.
    pub pre_command: Option<String>,
    /// Run after each action through `sh -c`, whatever its outcome.
    pub post_command: Option<String>,
    /// The `qsm` binary that runs the actions.
    pub program: PathBuf,
    /// The arguments that take that binary to this node's server (`--server`, `--node`, ...).
    pub conn_args: Vec<OsString>,
    /// The lock file held while the scheduler runs.
    pub lock: PathBuf,
}

/// The scheduler's way to its server, connecting again after a loss.
pub trait Link {
    /// The server, connecting first if there is no connection.
    fn server(&mut self) -> Result<&dyn Server>;
    /// Forgets the connection (it failed): the next [`Link::server`] connects again.
    fn lost(&mut self);
}

/// The longest wait between two attempts to reach a server that does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The most of a command's error output an event's detail quotes.
const DETAIL_TAIL: usize = 400;
/// The most of a command's error output kept to find its last line in.
const KEPT_OUTPUT: usize = 64 * 1024;
/// How long a post-command may run (a pre-command: until its window closes).
const POST_COMMAND_LIMIT: Duration = Duration::from_secs(3600);

/// This machine's clock, seconds since the epoch.
fn clock() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A uniform number in [0, 1).
fn random_fraction() -> f64 {
    let mut b = [0u8; 8];
    // Without randomness every run starts at its window's start: still correct.
    if getrandom::fill(&mut b).is_err() {
        return 0.0;
    }
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

/// Sleeps `seconds`, waking early when `stop` is set.
fn nap(seconds: f64, stop: &AtomicBool) {
    let until = clock() + seconds.max(0.0);
    while !stop.load(Ordering::Relaxed) {
        let left = until - clock();
        if left <= 0.0 {
            break;
        }
        std::thread::sleep(Duration::from_secs_f64(left.min(0.25)));
    }
}

/// Takes the scheduler's lock, refusing when another scheduler holds it.
pub fn take_lock(path: &std::path::Path) -> Result<File> {
    crate::private::make_parent(path)?;
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(ClientError::io("opening the scheduler's lock", path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(ClientError::Usage(format!(
            "another qsm sched of this node is running (it holds {})",
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(ClientError::io("locking", path)(e)),
    }
}

/// An outcome to report.
#[derive(Debug, Clone)]
struct Outcome {
    event: i64,
    result: RunResult,
    detail: String,
}

/// Runs schedules until `stop` is set, saying what it does through `say`, holding `lock`
/// ([`take_lock`]) all the while.
pub fn run(
    link: &mut dyn Link,
    options: &SchedOptions,
    lock: File,
    stop: &AtomicBool,
    say: &mut dyn FnMut(&str),
) -> Result<()> {
    let _lock = lock;
    let mut unreported: Option<Outcome> = None;
    let mut backoff = Duration::from_secs(1);
    // When each window's run starts, drawn once per window (server time).
    let mut planned: std::collections::HashMap<(String, i64), f64> = Default::default();
    let mut said_waiting: Option<(String, i64)> = None;
    // Until the server has heard this scheduler once: it then severs what a predecessor left
    // started.
    let mut fresh = true;
    while !stop.load(Ordering::Relaxed) {
        let failed = |link: &mut dyn Link, say: &mut dyn FnMut(&str), e: &dyn std::fmt::Display| {
            say(&format!("{e}; connecting again"));
            link.lost();
        };
        let server = match link.server() {
            Ok(s) => s,
            // Trying a refused password again and again would only lock the node out: a
            // wrong password, a locked node or a bad setting stops the scheduler, said.
            Err(
                e @ (ClientError::Usage(_)
                | ClientError::Server(ServerError::Unauthenticated(_) | ServerError::Denied(_))),
            ) => return Err(e),
            Err(e) => {
                failed(link, say, &e);
                nap(backoff.as_secs_f64(), stop);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        if let Some(o) = &unreported {
            match server.end_event(o.event, o.result, &o.detail) {
                Ok(()) => say(&format!("reported event {} {} late", o.event, o.result.name())),
                // Severed meanwhile, or the schedule deleted: nothing left to report to.
                Err(ServerError::NotFound(why)) => say(&format!("event {}: {why}", o.event)),
                Err(e) => {
                    failed(link, say, &e);
                    nap(backoff.as_secs_f64(), stop);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            }
            unreported = None;
        }
        let schedules = match server.schedules(fresh) {
            Ok(s) => {
                fresh = false;
                s
            }
            Err(e) => {
                failed(link, say, &e);
                nap(backoff.as_secs_f64(), stop);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_secs(1);
        // The windows follow the server's clock, whatever this machine's says (its whole
        // seconds: the middle of the second it was in).
        let skew = schedules.now as f64 + 0.5 - clock();
        let now = clock() + skew;
        planned.retain(|(_, w), _| schedules.due.iter().any(|d| d.window_start == *w));
        let next = schedules
            .due
            .iter()
            .map(|d| {
                let at =
                    *planned.entry((d.schedule.clone(), d.window_start)).or_insert_with(|| {
                        let width = (d.window_end - d.window_start) as f64 * options.spread;
                        d.window_start as f64 + width * random_fraction()
                    });
                (at, d)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let Some((at, due)) = next else {
            nap(options.poll.as_secs_f64(), stop);
            continue;
        };
        if at > now {
            let key = (due.schedule.clone(), due.window_start);
            if said_waiting.as_ref() != Some(&key) {
                say(&format!(
                    "next: schedule {}/{} ({}), window {} to {}, starting at {}",
                    due.domain,
                    due.schedule,
                    due.action,
                    qsm_types::time::format_time(due.window_start),
                    qsm_types::time::format_time(due.window_end),
                    qsm_types::time::format_time(at.ceil() as i64)
                ));
                said_waiting = Some(key);
            }
            nap((at - now).min(options.poll.as_secs_f64()), stop);
            continue;
        }
        let due = due.clone();
        let event = match server.start_event(&due.schedule, due.window_start) {
            Ok(Some(event)) => event,
            // Another scheduler of the node ran it, or the window closed: ask again.
            Ok(None) => continue,
            // The clocks disagree by a moment, or the schedule changed: ask again shortly.
            Err(e @ (ServerError::Refused(_) | ServerError::NotFound(_))) => {
                say(&format!("schedule {}: {e}", due.schedule));
                nap(0.5, stop);
                continue;
            }
            Err(e) => {
                failed(link, say, &e);
                continue;
            }
        };
        say(&format!(
            "schedule {}/{} ({}): event {event} started",
            due.domain, due.schedule, due.action
        ));
        let filespaces = match (due.action.as_str(), due.objects.is_empty()) {
            ("incremental", true) => Some(server.filespaces()),
            _ => None,
        };
        let left = due.window_end as f64 - (clock() + skew);
        let (result, detail) =
            execute(&due, filespaces, options, Duration::from_secs_f64(left.max(1.0)), stop);
        say(&format!("schedule {}: event {event} {}: {detail}", due.schedule, result.name()));
        let outcome = Outcome { event, result, detail };
        // The action may have outlived the connection (a long backup, a server restart).
        let reported =
            link.server().and_then(|s| Ok(s.end_event(event, result, &outcome.detail)?));
        match reported {
            Ok(()) => {}
            // Severed meanwhile, or the schedule deleted: nothing left to report to.
            Err(ClientError::Server(ServerError::NotFound(why))) => {
                say(&format!("event {event}: {why}"));
            }
            Err(e) => {
                failed(link, say, &e);
                unreported = Some(outcome);
            }
        }
    }
    Ok(())
}

/// Runs one action with its pre- and post-commands: its result and what it reported. The
/// pre-command may run until the window closes (`window_left`), the post-command
/// [`POST_COMMAND_LIMIT`]: a command that hangs must not hang the scheduler.
fn execute(
    due: &Due,
    filespaces: Option<qsm_types::node::Result<Vec<qsm_types::model::Filespace>>>,
    options: &SchedOptions,
    window_left: Duration,
    stop: &AtomicBool,
) -> (RunResult, String) {
    let env = [
        ("QSM_SCHEDULE", due.schedule.clone()),
        ("QSM_ACTION", due.action.clone()),
        ("QSM_WINDOW_START", due.window_start.to_string()),
    ];
    let (mut result, mut detail) = match &options.pre_command {
        Some(pre) => match shell(pre, &env, None, window_left) {
            // Stopped while the pre-command ran: no action is started any more.
            Ok(()) if stop.load(Ordering::Relaxed) => {
                (RunResult::Failed, "the scheduler was stopped before the action started".into())
            }
            Ok(()) => action(due, filespaces, options),
            Err(why) => (RunResult::Failed, format!("pre_command failed ({why}): not run")),
        },
        None => action(due, filespaces, options),
    };
    if let Some(post) = &options.post_command
        && let Err(why) = shell(post, &env, Some(result), POST_COMMAND_LIMIT)
    {
        if result == RunResult::Completed {
            result = RunResult::CompletedWithWarnings;
        }
        detail = format!("{detail}; post_command failed ({why})");
    }
    (result, detail)
}

/// The last `DETAIL_TAIL` bytes of `text`'s last non-empty line.
fn tail(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let line = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let mut start = line.len().saturating_sub(DETAIL_TAIL);
    while !line.is_char_boundary(start) {
        start += 1;
    }
    line[start..].to_owned()
}

/// Reads `pipe` to its end on a thread of its own, keeping its last [`KEPT_OUTPUT`] bytes (a
/// command printing gigabytes costs no memory).
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let Some(mut pipe) = pipe else { return kept };
        let mut buf = [0u8; 8192];
        while let Ok(n @ 1..) = pipe.read(&mut buf) {
            kept.extend_from_slice(&buf[..n]);
            if kept.len() > 2 * KEPT_OUTPUT {
                kept.drain(..kept.len() - KEPT_OUTPUT);
            }
        }
        kept
    })
}

/// Runs `command` through `sh -c` with `env` (and the outcome, after an action), killing it
/// and what it started after `limit`: why it failed, if it did.
fn shell(
    command: &str,
    env: &[(&str, String)],
    outcome: Option<RunResult>,
    limit: Duration,
) -> std::result::Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new("sh");
    c.arg("-c").arg(command).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    c.envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(r) = outcome {
        c.env("QSM_EVENT_STATE", r.name());
    }
    // A group of its own, so that a timeout kills what the command started too.
    c.process_group(0);
    let mut child = c.spawn().map_err(|e| format!("could not start sh: {e}"))?;
    let stderr = drain(child.stderr.take());
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                }
                let _ = child.wait();
                break Err(format!("still running after {} s: killed", limit.as_secs()));
            }
            Err(e) => break Err(format!("waiting for it: {e}")),
        }
    };
    let said = tail(&stderr.join().unwrap_or_default());
    let code = match status {
        Ok(s) if s.success() => return Ok(()),
        Ok(s) => match s.code() {
            Some(code) => format!("exit {code}"),
            None => "killed by a signal".to_owned(),
        },
        Err(why) => why,
    };
    Err(if said.is_empty() { code } else { format!("{code}: {said}") })
}

/// Runs the action as a child `qsm`: its result from the exit code (0: completed, 4: with
/// warnings), its detail from the summary it printed.
fn action(
    due: &Due,
    filespaces: Option<qsm_types::node::Result<Vec<qsm_types::model::Filespace>>>,
    options: &SchedOptions,
) -> (RunResult, String) {
    let mut objects: Vec<OsString> = due.objects.iter().map(OsString::from).collect();
    match filespaces {
        Some(Ok(list)) if list.is_empty() => {
            return (
                RunResult::Failed,
                "the node has no filespaces to back up incrementally: give the schedule --objects"
                    .into(),
            );
        }
        Some(Ok(list)) => objects = list.into_iter().map(|f| OsString::from(f.name)).collect(),
        Some(Err(e)) => return (RunResult::Failed, format!("listing the node's filespaces: {e}")),
        None => {}
    }
    let mut args: Vec<OsString> = match due.action.as_str() {
        "incremental" => vec!["backup".into()],
        "selective" => vec!["backup".into(), "--selective".into()],
        "archive" => vec![
            "archive".into(),
            "-d".into(),
            format!(
                "schedule {} of {}",
                due.schedule,
                qsm_types::time::format_time(due.window_start)
            )
            .into(),
        ],
        other => return (RunResult::Failed, format!("this client cannot run action {other}")),
    };
    args.push("--json".into());
    args.extend(options.conn_args.iter().cloned());
    args.push("--".into());
    args.extend(objects);
    let child = Command::new(&options.program)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return (
                RunResult::Failed,
                format!("could not start {}: {e}", options.program.display()),
            );
        }
    };
    // Both pipes drained at once, so a child filling one never waits on the other.
    let errors = drain(child.stderr.take());
    let mut out = Vec::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_end(&mut out);
    }
    let status = child.wait();
    let errors = errors.join().unwrap_or_default();
    let result = match status.as_ref().map(|s| s.code()) {
        Ok(Some(0)) => RunResult::Completed,
        Ok(Some(4)) => RunResult::CompletedWithWarnings,
        _ => RunResult::Failed,
    };
    let detail = match (result, summary(&out)) {
        (RunResult::Failed, _) => {
            let why = tail(&errors);
            match status {
                Ok(s) if why.is_empty() => format!("{} {s}", due.action),
                Ok(_) => why,
                Err(e) => format!("waiting for {}: {e}", options.program.display()),
            }
        }
        (_, Some(s)) => s,
        (_, None) => format!("{} ended without a summary", due.action),
    };
    (result, detail)
}

/// One line from the JSON summary a backup or an archive printed.
fn summary(stdout: &[u8]) -> Option<String> {
    let reports: Vec<serde_json::Value> = serde_json::from_slice(stdout).ok()?;
    let sum = |field: &str| -> u64 { reports.iter().filter_map(|r| r[field].as_u64()).sum() };
    let seconds: f64 = reports.iter().filter_map(|r| r["seconds"].as_f64()).sum();
    let stored = sum("bytes_stored") as f64 / 1e6;
    let n = reports.len();
    let s = if n == 1 { "" } else { "s" };
    Some(if reports.iter().any(|r| r.get("examined").is_some()) {
        format!(
            "{n} filespace{s}: {} examined, {} backed up, {} failed, {stored:.1} MB stored in {seconds:.1} s",
            sum("examined"),
            sum("backed_up"),
            sum("failed")
        )
    } else {
        format!(
            "{n} path{s} archived: {} objects, {} failed, {stored:.1} MB stored",
            sum("objects"),
            sum("failed")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_read_from_backup_and_archive_reports() {
        let backup = br#"[{"examined": 10, "backed_up": 4, "failed": 1, "bytes_stored": 2000000, "seconds": 1.5},
                         {"examined": 5, "backed_up": 0, "failed": 0, "bytes_stored": 0, "seconds": 0.5}]"#;
        assert_eq!(
            summary(backup).unwrap(),
            "2 filespaces: 15 examined, 4 backed up, 1 failed, 2.0 MB stored in 2.0 s"
        );
        let archive = br#"[{"objects": 3, "failed": 0, "bytes_stored": 1000000}]"#;
        assert_eq!(
            summary(archive).unwrap(),
            "1 path archived: 3 objects, 0 failed, 1.0 MB stored"
        );
        assert_eq!(summary(b"not json"), None);
    }

    #[test]
    fn commands_report_why_they_failed() {
        let long = Duration::from_secs(60);
        assert_eq!(shell("true", &[], None, long), Ok(()));
        let e = shell("echo nope >&2; exit 3", &[], None, long).unwrap_err();
        assert_eq!(e, "exit 3: nope");
        let e = shell("test \"$QSM_EVENT_STATE\" = failed", &[], Some(RunResult::Completed), long);
        assert_eq!(e, Err("exit 1".to_owned()));
        assert!(
            shell(
                "test \"$QSM_ACTION\" = archive",
                &[("QSM_ACTION", "archive".into())],
                None,
                long
            )
            .is_ok()
        );
    }

    #[test]
    fn a_command_that_hangs_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("survived");
        let started = std::time::Instant::now();
        // A grandchild that would outlive a kill of the shell alone.
        let command = format!("(sleep 3; touch '{}') & echo working >&2; sleep 30", mark.display());
        let e = shell(&command, &[], None, Duration::from_millis(500)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10), "waited {:?}", started.elapsed());
        assert!(e.starts_with("still running after 0 s: killed"), "{e}");
        std::thread::sleep(Duration::from_secs(4));
        assert!(!mark.exists(), "the command's background child outlived it");
        // Megabytes on stderr: only its last line is told, and nothing blocks on the pipe.
        let noisy =
            "head -c 5000000 /dev/zero | tr '\\0' x >&2; echo >&2; echo last words >&2; exit 2";
        let e = shell(noisy, &[], None, Duration::from_secs(60)).unwrap_err();
        assert_eq!(e, "exit 2: last words");
    }

    #[test]
    fn a_second_scheduler_of_a_node_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sched.lock");
        let held = take_lock(&path).unwrap();
        let e = take_lock(&path).unwrap_err().to_string();
        assert!(e.contains("another qsm sched"), "{e}");
        drop(held);
        assert!(take_lock(&path).is_ok());
    }
}
