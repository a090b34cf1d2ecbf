//! `qsm`: the command line. It parses flags and calls library functions; no logic of its own.

mod codec_cmd;
mod output;

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
    /// Compress a file or stdin into a QSM stream of independent quanta.
    Compress(codec_cmd::CompressArgs),
    /// Decompress a QSM stream (all of it, or a range of quanta).
    Decompress(codec_cmd::DecompressArgs),
    /// Describe a QSM stream: codecs, quanta, sizes, ratio.
    Info(codec_cmd::InfoArgs),
    /// List the codecs of this build with their permanent ids and levels.
    Codecs(codec_cmd::CodecsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Compress(args) => codec_cmd::compress(args),
        Command::Decompress(args) => codec_cmd::decompress(args),
        Command::Info(args) => codec_cmd::info(args),
        Command::Codecs(args) => codec_cmd::codecs(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qsm: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
