//! `--metrics-file FILE`: a client command's outcome as a Prometheus textfile, for
//! node_exporter's textfile collector (issue 26), so a backup run from cron or a timer is
//! watched like the server: when it last ran, whether it succeeded, what it did. Commands
//! note their figures as they finish ([`note`]); `main` writes the file once the command has
//! ended, whatever its outcome, atomically (a scrape never reads half a file).

use std::path::Path;
use std::sync::Mutex;

use qsm_server::metrics::{Exposition, Kind, labels};

/// Figures noted by the command: name (without `qsm_client_`), help, value; a name noted
/// again adds up (one figure over every path of a command).
static FIGURES: Mutex<Vec<(&'static str, &'static str, f64)>> = Mutex::new(Vec::new());

/// Notes a figure of the command's outcome.
pub fn note(name: &'static str, help: &'static str, value: f64) {
    let mut figures = FIGURES.lock().unwrap_or_else(|p| p.into_inner());
    match figures.iter_mut().find(|f| f.0 == name) {
        Some(f) => f.2 += value,
        None => figures.push((name, help, value)),
    }
}

/// Writes the outcome of `command` (its exit code, when it ended, how long it ran, and the
/// figures noted) to `path`, through a temporary file beside it renamed over it.
pub fn write(path: &Path, command: &str, exit_code: u8, seconds: f64) -> std::io::Result<()> {
    let mut x = Exposition::default();
    // The file's name tells the jobs apart: two files of backups must not give node_exporter
    // the same series twice.
    let job = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let l = || labels(&[("job", &job), ("command", command)]);
    let now = qsm_types::now() as f64;
    x.family(
        "qsm_client_last_run_timestamp_seconds",
        Kind::Gauge,
        "When the command last ended.",
        [(l(), now)],
    );
    x.family(
        "qsm_client_last_run_duration_seconds",
        Kind::Gauge,
        "How long the command ran.",
        [(l(), seconds)],
    );
    x.family(
        "qsm_client_last_run_exit_code",
        Kind::Gauge,
        "Its exit code: 0 succeeded, 4 some files skipped, 1 failed, 2 bad usage.",
        [(l(), f64::from(exit_code))],
    );
    x.family(
        "qsm_client_last_run_success",
        Kind::Gauge,
        "1 if the command succeeded entirely, else 0.",
        [(l(), f64::from(u8::from(exit_code == 0)))],
    );
    let figures = FIGURES.lock().unwrap_or_else(|p| p.into_inner());
    for (name, help, value) in figures.iter() {
        x.family(&format!("qsm_client_last_run_{name}"), Kind::Gauge, help, [(l(), *value)]);
    }
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "names no file"))?;
    // node_exporter reads `*.prom`: the temporary name is not one.
    let temporary =
        path.with_file_name(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    std::fs::write(&temporary, x.text())?;
    std::fs::rename(&temporary, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}
