//! What `qsm backup` and `qsm archive` share: dedup and encryption flags, include and exclude
//! patterns, the options' merge, and the loop over paths with its progress line.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use qsm_client::config::ServerOptions;
use qsm_client::{BackupOptions, BackupSummary};

use crate::cmd::key::KeyUse;
use crate::conn::{ClientConfig, Conn, Connected};
use crate::render::mb;

/// Deduplication and encryption, over the client configuration's `dedup` and `encryption`.
#[derive(Debug, Args)]
pub struct Protect {
    /// Deduplicate: cut files by content and send only chunks the node's dedup scope does not
    /// hold (on|off; default off, or `dedup` in client.toml).
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    dedup: Option<bool>,
    /// Encrypt every quantum on this machine with the node's key, made on first use and
    /// protected by a passphrase from the terminal or QSM_PASSPHRASE_FILE (on|off; default
    /// off, or `encryption` in client.toml). The server keeps a copy of the wrapped key.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    encryption: Option<bool>,
    /// The node's key file (default: `key_file` in client.toml, $QSM_KEY_FILE, or
    /// ~/.config/qsm/key).
    #[arg(long)]
    key_file: Option<PathBuf>,
}

pub(crate) fn on_off(text: &str) -> std::result::Result<bool, String> {
    qsm_types::clientopts::switch(text).ok_or_else(|| format!("{text:?}: on or off"))
}

impl Protect {
    /// The options these flags give.
    pub(crate) fn flags_given(&self) -> Vec<&'static str> {
        let mut given = Vec::new();
        if self.dedup.is_some() {
            given.push("dedup");
        }
        if self.encryption.is_some() {
            given.push("encryption");
        }
        given
    }

    /// Sets `options.dedup`, `.encryption` and `.dedup_cache` from the flags, then the
    /// configuration; opens (or makes) the key before anything is read.
    pub(crate) fn apply(
        &self,
        config: &ClientConfig,
        server: &ServerOptions,
        connected: &Connected,
        home: &Conn,
        options: &mut BackupOptions,
    ) -> Result<()> {
        // A flag the server's option set forces is overridden (said on stderr).
        let dedup = unless_forced(server, "dedup", self.dedup, "--dedup");
        let encryption = unless_forced(server, "encryption", self.encryption, "--encryption");
        options.dedup = match dedup.or(config.dedup) {
            Some(on) => on,
            // A server older than deduplication has no default (and no dedup).
            None => connected.server().dedup_info().is_ok_and(|i| i.dedup_default),
        };
        options.dedup_cache = connected.dedup_cache(home);
        if encryption.or(config.encryption).unwrap_or(false) {
            let given = self.key_file.clone().or(config.key_file.clone());
            options.encryption = crate::cmd::key::node_keys(
                given,
                config.cipher.as_deref(),
                connected.server().as_ref(),
                KeyUse::Backup,
            )?;
        }
        Ok(())
    }
}

/// The client option set the server gives this node (none from the embedded store unless
/// its administrator set one, or from a server older than option sets).
pub(crate) fn server_options(connected: &Connected) -> Result<ServerOptions> {
    let set =
        connected.server().client_options().context("asking for the node's client options")?;
    Ok(ServerOptions::new(set.as_ref())?)
}

/// Says (in a text summary) which options the server's option set gave.
pub(crate) fn say_server_options(server: &ServerOptions) {
    if let Some(set) = &server.set {
        outln!("Options from the server's client option set {set}: {}.", server.given.join(", "));
    }
}

/// `flag` (spelled `spelled`), unless the server's option set forces option `name`: a forced
/// option wins over flags (said on stderr, so the user knows the flag did nothing).
pub(crate) fn unless_forced<T>(
    server: &ServerOptions,
    name: &str,
    flag: Option<T>,
    spelled: &str,
) -> Option<T> {
    if flag.is_some() && server.forces(name) {
        errln!(
            "qsm: warning: {spelled} is overridden: the server's client option set {} forces {name}",
            server.set.as_deref().unwrap_or_default()
        );
        return None;
    }
    flag
}

/// Include and exclude patterns, added to those of the client configuration.
#[derive(Debug, Args)]
pub struct Patterns {
    /// Skip what matches (repeatable): a name at any depth (`*.o`, `.cache`), a path below the
    /// root (`build/out`), an absolute path (`/home/*/.cache`); a trailing `/` matches
    /// directories only. Excluded directories are not entered; files excluded since the last
    /// backup are marked inactive, like deleted ones.
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Take only what matches, or lies below a directory that does (repeatable; same pattern
    /// forms). Directories are still walked to find matches. An exclude beats an include.
    #[arg(long, value_name = "PATTERN")]
    include: Vec<String>,
    /// Bind what matches PATTERN to the management class CLASS of the node's policy domain
    /// (repeatable; same pattern forms; the last match wins, as TSM reads include statements).
    #[arg(long, value_name = "PATTERN=CLASS")]
    mgmtclass: Vec<String>,
}

/// The backup options from flags, then the client configuration, then the defaults.
pub(crate) fn backup_options(
    config: &ClientConfig,
    compression: Option<&str>,
    threads: Option<usize>,
    patterns: &Patterns,
) -> Result<BackupOptions> {
    let mut options = config.backup_options(&qsm_client::config::Given {
        compression,
        threads,
        include: &patterns.include,
        exclude: &patterns.exclude,
        mgmtclass: &patterns.mgmtclass,
    })?;
    options.threads = crate::usage::threads(options.threads)?;
    Ok(options)
}

pub(crate) fn each_path(
    paths: &[PathBuf],
    json: bool,
    verb: &str,
    op: &mut dyn FnMut(&Path, &mut qsm_client::Progress<'_>) -> qsm_client::Result<BackupSummary>,
    on_done: &dyn Fn(&BackupSummary),
) -> Result<Vec<BackupSummary>> {
    let mut summaries = Vec::with_capacity(paths.len());
    for path in paths {
        let mut bar = ProgressLine::new(json);
        let s =
            op(path, &mut |s| bar.show(s)).with_context(|| format!("{verb} {}", path.display()))?;
        bar.finish();
        for w in &s.warnings {
            errln!("qsm: warning: {w}");
        }
        if !json {
            on_done(&s);
        }
        summaries.push(s);
    }
    Ok(summaries)
}

/// A live status line on a terminal while objects are sent: objects, bytes read and stored,
/// ratio and throughput. (No ETA: the walk runs beside the transfer, so the total is unknown
/// until the end.) Nothing when stderr is not a terminal or output is JSON.
pub(crate) struct ProgressLine {
    bar: Option<indicatif::ProgressBar>,
    started: std::time::Instant,
}

impl ProgressLine {
    fn new(json: bool) -> ProgressLine {
        use std::io::IsTerminal;
        let bar = (!json && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            bar
        });
        ProgressLine { bar, started: std::time::Instant::now() }
    }

    fn show(&mut self, s: &qsm_client::BackupSummary) {
        let Some(bar) = &self.bar else { return };
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = s.bytes_read as f64 / secs;
        // The total is known once the walk has ended; until then there is no honest ETA.
        let eta = if !s.scan_done {
            "scanning".to_owned()
        } else if rate > 0.0 {
            let left = s.queued_bytes.saturating_sub(s.bytes_read) as f64 / rate;
            format!("ETA {}:{:02}", left as u64 / 60, left as u64 % 60)
        } else {
            String::new()
        };
        bar.set_message(format!(
            "{} examined, {} sent, {:.1} of {:.1} MB read, {:.1} MB stored ({:.2}:1), {:.1} MB/s, {eta}",
            s.examined,
            s.backed_up,
            mb(s.bytes_read),
            mb(s.queued_bytes),
            mb(s.bytes_stored),
            s.bytes_read as f64 / s.bytes_stored.max(1) as f64,
            rate / 1e6
        ));
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
