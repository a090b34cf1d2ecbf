//! `qsm key init | show-fingerprint | change-passphrase`: the node's master key, kept in a key
//! file wrapped under a passphrase (`qsm-crypt`, FORMAT.md §12). Losing the passphrase loses
//! every encrypted backup: nothing, on the client or the server, can open the key without it.
//!
//! Passphrases come from the terminal (not echoed), or from the file named by
//! `QSM_PASSPHRASE_FILE` (and `QSM_NEW_PASSPHRASE_FILE` for a new one) for scripts.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use qsm_crypt::{KdfParams, KeyFile, MasterKey};

use crate::output::Output;

#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The key file (default: $QSM_KEY_FILE, or ~/.config/qsm/key).
    #[arg(long, global = true)]
    key_file: Option<PathBuf>,
    #[command(subcommand)]
    command: KeyCommand,
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Generate the node's master key and write it, wrapped under a new passphrase.
    Init,
    /// Print the key's fingerprint (asks the passphrase: proves it opens the key).
    ShowFingerprint,
    /// Rewrap the key under a new passphrase; backups made with it stay readable.
    ChangePassphrase,
}

/// Shortest passphrase accepted for a new key.
const MIN_PASSPHRASE: usize = 8;

fn key_path(given: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = given.or_else(|| std::env::var_os("QSM_KEY_FILE").map(PathBuf::from)) {
        return Ok(p);
    }
    match std::env::var_os("HOME") {
        Some(h) => Ok(PathBuf::from(h).join(".config/qsm/key")),
        None => {
            bail!("neither --key-file, QSM_KEY_FILE nor HOME is set: say where the key file is")
        }
    }
}

/// A passphrase from the file named by `env`, or from the terminal with `prompt`.
fn passphrase(env: &str, prompt: &str) -> Result<Vec<u8>> {
    if let Some(path) = std::env::var_os(env) {
        let text = std::fs::read(&path).with_context(|| {
            format!("reading the passphrase from {} ({env})", Path::new(&path).display())
        })?;
        // One trailing newline is the file's, not the passphrase's.
        let text = text.strip_suffix(b"\n").unwrap_or(&text);
        return Ok(text.strip_suffix(b"\r").unwrap_or(text).to_vec());
    }
    let tty =
        std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty").with_context(|| {
            format!("no terminal to ask for the passphrase: set {env} to a file holding it")
        })?;
    let saved = rustix::termios::tcgetattr(&tty).context("reading the terminal's settings")?;
    let mut quiet = saved.clone();
    quiet.local_modes.remove(rustix::termios::LocalModes::ECHO);
    rustix::termios::tcsetattr(&tty, rustix::termios::OptionalActions::Now, &quiet)
        .context("turning the terminal's echo off")?;
    let mut line = String::new();
    let read = (|| -> std::io::Result<()> {
        (&tty).write_all(prompt.as_bytes())?;
        std::io::BufReader::new(&tty).read_line(&mut line)?;
        (&tty).write_all(b"\n")
    })();
    // Echo comes back whatever happened.
    let _ = rustix::termios::tcsetattr(&tty, rustix::termios::OptionalActions::Now, &saved);
    read.context("reading the passphrase")?;
    Ok(line.trim_end_matches(['\n', '\r']).as_bytes().to_vec())
}

fn new_passphrase(env: &str) -> Result<Vec<u8>> {
    let first = passphrase(env, "New passphrase: ")?;
    if first.len() < MIN_PASSPHRASE {
        bail!("the passphrase is shorter than {MIN_PASSPHRASE} bytes");
    }
    if std::env::var_os(env).is_none() && passphrase(env, "The same again: ")? != first {
        bail!("the two passphrases differ; nothing was written");
    }
    Ok(first)
}

fn read_key_file(path: &Path) -> Result<KeyFile> {
    let bytes = std::fs::read(path).with_context(|| {
        format!("reading the key file {} (make one with `qsm key init`)", path.display())
    })?;
    KeyFile::from_bytes(&bytes).with_context(|| format!("key file {}", path.display()))
}

fn open(path: &Path, file: &KeyFile, env: &str) -> Result<MasterKey> {
    let pass = passphrase(env, "Passphrase: ")?;
    file.unwrap_key(&pass).with_context(|| format!("key file {}", path.display()))
}

fn exists(path: &Path) -> String {
    format!(
        "{} exists: a key is already set up here (a new one could not open earlier backups)",
        path.display()
    )
}

/// Writes `file` at `path`, mode 0600, through [`Output`] (a temporary file synced and
/// renamed into place), so a crash leaves the old file or the new one, never half of one.
fn write_key_file(path: &Path, file: &KeyFile, replace: bool) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if !replace && path.exists() {
        bail!(exists(path));
    }
    let mut out = Output::open(Some(path), replace, false)?;
    // Private before the key is written into it.
    out.set_permissions(std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making {} private", path.display()))?;
    out.write_all(file.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    out.commit()
}

pub fn key(args: KeyArgs) -> Result<bool> {
    let path = key_path(args.key_file)?;
    match args.command {
        KeyCommand::Init => {
            if path.exists() {
                // Checked before asking anything, and again when writing.
                bail!(exists(&path));
            }
            let pass = new_passphrase("QSM_PASSPHRASE_FILE")?;
            let key = MasterKey::generate()?;
            write_key_file(&path, &key.wrap(&pass, KdfParams::DEFAULT)?, false)?;
            println!("key written to {}", path.display());
            println!("fingerprint {}", key.fingerprint());
            println!(
                "Keep the passphrase safe: without it no one, not even the server's administrator, can restore this node's encrypted backups."
            );
        }
        KeyCommand::ShowFingerprint => {
            let file = read_key_file(&path)?;
            println!("{}", open(&path, &file, "QSM_PASSPHRASE_FILE")?.fingerprint());
        }
        KeyCommand::ChangePassphrase => {
            let file = read_key_file(&path)?;
            let key = open(&path, &file, "QSM_PASSPHRASE_FILE")?;
            let pass = new_passphrase("QSM_NEW_PASSPHRASE_FILE")?;
            write_key_file(&path, &key.wrap(&pass, KdfParams::DEFAULT)?, true)?;
            println!(
                "passphrase changed; fingerprint {} (the key itself is unchanged)",
                key.fingerprint()
            );
        }
    }
    Ok(true)
}
