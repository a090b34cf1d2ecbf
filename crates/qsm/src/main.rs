//! `qsm`: the command line. It parses flags and calls library functions; no logic of its own.

mod client_cmd;
mod codec_cmd;
mod conn;
mod journal_cmd;
mod key_cmd;
mod output;
mod server_cmd;
mod stand_cmd;
mod usage;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// QSM, the Quantum Storage Manager.
#[derive(Debug, Parser)]
#[command(name = "qsm", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Back up directories or files (incremental) into the store.
    Backup(client_cmd::BackupArgs),
    /// Restore a backed-up directory or file.
    Restore(client_cmd::RestoreArgs),
    /// Archive directories or files, kept by their own retention.
    Archive(client_cmd::ArchiveArgs),
    /// Retrieve an archive.
    Retrieve(client_cmd::RetrieveArgs),
    /// List what the store holds.
    #[command(subcommand)]
    Query(client_cmd::QueryWhat),
    /// Run a QSM server.
    Server(server_cmd::ServerArgs),
    /// Administer a QSM server: nodes, administrators, sessions.
    Admin(server_cmd::AdminArgs),
    /// Compress a file or stdin into a QSM stream of independent quanta.
    Compress(codec_cmd::CompressArgs),
    /// Decompress a QSM stream (all of it, or a range of quanta).
    Decompress(codec_cmd::DecompressArgs),
    /// Describe a QSM stream: codecs, quanta, sizes, ratio.
    Info(codec_cmd::InfoArgs),
    /// List the codecs of this build with their permanent ids and levels.
    Codecs(codec_cmd::CodecsArgs),
    /// Measure block algorithms block by block (min, mean, percentiles, max).
    #[command(subcommand)]
    Stand(stand_cmd::StandCommand),
    /// The node's encryption key: init, show-fingerprint, change-passphrase.
    Key(key_cmd::KeyArgs),
    /// The change journal: a daemon recording what changes, so backups need not scan.
    Journal(journal_cmd::JournalArgs),
}

/// Exit code when an operation completed but skipped some files (TSM uses 4 likewise).
const EXIT_PARTIAL: u8 = 4;
/// Exit code of bad usage, as clap gives for what it refuses itself.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Backup(args) => client_cmd::backup(args),
        Command::Restore(args) => client_cmd::restore(args),
        Command::Archive(args) => client_cmd::archive(args),
        Command::Retrieve(args) => client_cmd::retrieve(args),
        Command::Query(what) => client_cmd::query(what),
        Command::Server(args) => server_cmd::server(args),
        Command::Admin(args) => server_cmd::admin(args),
        Command::Compress(args) => codec_cmd::compress(args).map(|()| true),
        Command::Decompress(args) => codec_cmd::decompress(args).map(|()| true),
        Command::Info(args) => codec_cmd::info(args).map(|()| true),
        Command::Codecs(args) => codec_cmd::codecs(args).map(|()| true),
        Command::Stand(cmd) => stand_cmd::stand(cmd),
        Command::Key(args) => key_cmd::key(args),
        Command::Journal(args) => journal_cmd::journal(args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        // Some files were skipped (unreadable, vanished, changed while read): see the warnings.
        Ok(false) => ExitCode::from(EXIT_PARTIAL),
        Err(e) => {
            eprintln!("qsm: error: {}", usage::chain(&e));
            if usage::is_usage(&e) { ExitCode::from(EXIT_USAGE) } else { ExitCode::FAILURE }
        }
    }
}
