//! `qsm`: the command line. It parses flags and calls library functions; no logic of its own.

// First: its `outln!` and `errln!` are for every module after it.
#[macro_use]
mod output;
mod render;

mod cmd;
mod conn;
mod metrics_file;
mod usage;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// QSM, the Quantum Storage Manager.
#[derive(Debug, Parser)]
#[command(name = "qsm", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Also write the command's outcome (when it ended, its exit code, what it did) to FILE
    /// as Prometheus metrics, for node_exporter's textfile collector; replaced atomically.
    #[arg(long, global = true, value_name = "FILE")]
    metrics_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Back up directories or files (incremental) into the store.
    Backup(cmd::backup::BackupArgs),
    /// Restore a backed-up directory or file.
    Restore(cmd::restore::RestoreArgs),
    /// Archive directories or files, kept by their own retention.
    Archive(cmd::archive::ArchiveArgs),
    /// Retrieve an archive.
    Retrieve(cmd::retrieve::RetrieveArgs),
    /// List what the store holds.
    #[command(subcommand)]
    Query(cmd::query::QueryWhat),
    /// Run a QSM server.
    Server(cmd::server::ServerArgs),
    /// Administer a QSM server, or with no --server the embedded store: nodes, policy,
    /// expiration, reclamation, audit, catalog backups, sessions and processes.
    Admin(cmd::admin::AdminArgs),
    /// Compress a file or stdin into a QSM stream of independent quanta.
    Compress(cmd::codec::CompressArgs),
    /// Decompress a QSM stream (all of it, or a range of quanta).
    Decompress(cmd::codec::DecompressArgs),
    /// Describe a QSM stream: codecs, quanta, sizes, ratio.
    Info(cmd::codec::InfoArgs),
    /// List the codecs of this build with their permanent ids and levels.
    Codecs(cmd::codec::CodecsArgs),
    /// Measure block algorithms block by block (min, mean, percentiles, max).
    #[command(subcommand)]
    Stand(cmd::stand::StandCommand),
    /// The node's encryption key: init, show-fingerprint, change-passphrase.
    Key(cmd::key::KeyArgs),
    /// The change journal: a daemon recording what changes, so backups need not scan.
    Journal(cmd::journal::JournalArgs),
    /// The client scheduler: runs the node's scheduled backups and archives in the windows
    /// its server gives, until stopped (for systemd: contrib/qsm-sched.service).
    #[command(long_about = "The client scheduler: runs the node's scheduled backups and \
        archives (`qsm admin define schedule` and `define association` on the server) in the \
        windows its server gives, each as the `qsm backup` or `qsm archive` a user would run, \
        and reports each outcome as the schedule's event, until stopped (SIGTERM; for \
        systemd: contrib/qsm-sched.service).\n\n\
        client.toml may set pre_command (run through sh before each action; if it fails, the \
        event fails and the action is skipped; killed when the window closes) and \
        post_command (run after, whatever the outcome; killed after an hour). One scheduler \
        runs per node: a second is refused (the lock $XDG_STATE_HOME/qsm/sched-NODE.lock).")]
    Sched(cmd::sched::SchedArgs),
}

/// Exit code when an operation completed but skipped some files (TSM uses 4 likewise).
const EXIT_PARTIAL: u8 = 4;
/// Exit code of bad usage, as clap gives for what it refuses itself.
const EXIT_USAGE: u8 = 2;
/// Exit code of a failure.
const EXIT_FAILURE: u8 = 1;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let started = std::time::Instant::now();
    let command = cli.command.name();
    let result = match cli.command {
        Command::Backup(args) => cmd::backup::backup(args),
        Command::Restore(args) => cmd::restore::restore(args),
        Command::Archive(args) => cmd::archive::archive(args),
        Command::Retrieve(args) => cmd::retrieve::retrieve(args),
        Command::Query(what) => cmd::query::query(what),
        Command::Server(args) => cmd::server::server(args),
        Command::Admin(args) => cmd::admin::admin(args),
        Command::Compress(args) => cmd::codec::compress(args).map(|()| true),
        Command::Decompress(args) => cmd::codec::decompress(args).map(|()| true),
        Command::Info(args) => cmd::codec::info(args).map(|()| true),
        Command::Codecs(args) => cmd::codec::codecs(args).map(|()| true),
        Command::Stand(cmd) => cmd::stand::stand(cmd),
        Command::Key(args) => cmd::key::key(args),
        Command::Journal(args) => cmd::journal::journal(args),
        Command::Sched(args) => cmd::sched::sched(args),
    };
    let code = exit_code(result);
    if let Some(path) = &cli.metrics_file
        && let Err(e) = metrics_file::write(path, command, code, started.elapsed().as_secs_f64())
    {
        errln!("qsm: warning: --metrics-file {}: not written: {e}", path.display());
    }
    ExitCode::from(code)
}

/// The exit code of a command's result, its error said first.
fn exit_code(result: anyhow::Result<cmd::Complete>) -> u8 {
    if let (Ok(_), Some(why)) = (&result, output::failure()) {
        errln!("qsm: error: writing stdout: {why}: the output is incomplete");
        return EXIT_FAILURE;
    }
    match result {
        Ok(true) => 0,
        // Some files were skipped (unreadable, vanished, changed while read): see the warnings.
        Ok(false) => EXIT_PARTIAL,
        // A data stream whose reader has gone (`qsm decompress F | head -c 100`): done.
        Err(e) if output::reader_gone(&e) => 0,
        Err(e) => {
            errln!("qsm: error: {}", usage::chain(&e));
            if usage::is_usage(&e) { EXIT_USAGE } else { EXIT_FAILURE }
        }
    }
}

impl Command {
    /// The command's name, as typed.
    fn name(&self) -> &'static str {
        match self {
            Command::Backup(_) => "backup",
            Command::Restore(_) => "restore",
            Command::Archive(_) => "archive",
            Command::Retrieve(_) => "retrieve",
            Command::Query(_) => "query",
            Command::Server(_) => "server",
            Command::Admin(_) => "admin",
            Command::Compress(_) => "compress",
            Command::Decompress(_) => "decompress",
            Command::Info(_) => "info",
            Command::Codecs(_) => "codecs",
            Command::Stand(_) => "stand",
            Command::Key(_) => "key",
            Command::Journal(_) => "journal",
            Command::Sched(_) => "sched",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value parsers that check ranges give the type their field holds: a mismatch (an
    /// untyped literal read as i32 for a u32 field) panics only when a valid value or a
    /// default is parsed, which the refusals tested elsewhere never reach.
    #[test]
    fn every_checked_option_takes_its_valid_values_and_defaults() {
        for line in [
            "backup --txn-group-max 10 --txn-byte-limit 1000 --changing-retries 5 --limit-upload 10Mbit -T 2 --dedup on /x",
            "restore --id 5 /x",
            "restore --pit 2026-01-01 /x",
            "archive -d d --retain-days nolimit /x",
            "archive -d d --retain-days 0 /x",
            "retrieve --id 3 /x",
            "server --txn-group-max 10 --txn-byte-limit 100 --max-sessions 5",
            "admin reclaim stgpool",
            "admin reclaim stgpool --threshold 50",
            "admin expire inventory",
            "admin expire inventory --resource 8 --duration 60",
            "admin query actlog",
            "admin query actlog --limit 10 --since @0",
            "admin register-admin x --privilege system,policy",
            "admin grant authority x --privilege none",
            "admin define mgmtclass d c --versions-exist 2 --versions-deleted 0 --retain-extra nolimit --retain-only 30 --retain-archive 365",
            "admin audit stgpool --container ff",
            "compress -q 64K -T 2 -l 3 f",
            "decompress --quanta 3..7 -T 1 f",
            "stand compare a b",
            "stand compare a b --threshold 2.5",
            "stand load cpu:1 --seconds 1.5",
            "sched --poll 5m --spread 0",
        ] {
            let args = std::iter::once("qsm").chain(line.split(' '));
            if let Err(e) = Cli::try_parse_from(args) {
                panic!("{line}: {e}");
            }
        }
    }
}
