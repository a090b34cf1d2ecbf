//! `qsm key init | show-fingerprint | change-passphrase | recover | upload`, and the key
//! loading of backups and restores with encryption: the node's master key, kept in a key
//! file wrapped under a passphrase (`qsm-crypt`, FORMAT.md §12). Losing the passphrase loses
//! every encrypted backup: nothing, on the client or the server, can open the key without it.
//!
//! Passphrases come from the terminal (not echoed), or from the file named by
//! `QSM_PASSPHRASE_FILE` (and `QSM_NEW_PASSPHRASE_FILE` for a new one) for scripts.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use qsm_client::keys::NodeKeys;
use qsm_client::server::Server;
use qsm_crypt::{Aead, KdfParams, KeyFile, MasterKey};

use crate::conn::Conn;
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
    /// Rewrap the key under a new passphrase; backups made with it stay readable. The
    /// server's copy is updated too when a server (or the embedded store) holds one.
    ChangePassphrase {
        #[command(flatten)]
        home: Conn,
    },
    /// Fetch the server's copy of this node's key file onto this machine (a new machine, or a
    /// lost key file): asks the passphrase, so only its owner can use it.
    Recover {
        #[command(flatten)]
        home: Conn,
    },
    /// Store this machine's key file on the server (backups with encryption do it by
    /// themselves when the server holds none).
    Upload {
        /// Replace a different key file the server holds (it may be the only copy of the key
        /// older backups were sealed with: be sure).
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        home: Conn,
    },
}

/// Shortest passphrase accepted for a new key.
const MIN_PASSPHRASE: usize = 8;

pub fn key_path(given: Option<PathBuf>) -> Result<PathBuf> {
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
        crate::conn::check_owner_only(Path::new(&path), &format!("passphrase file ({env})"))?;
        let text = std::fs::read(&path).with_context(|| {
            format!("reading the passphrase from {} ({env})", Path::new(&path).display())
        })?;
        // One trailing newline is the file's, not the passphrase's.
        let text = text.strip_suffix(b"\n").unwrap_or(&text);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.is_empty() {
            bail!("the passphrase file {} ({env}) is empty", Path::new(&path).display());
        }
        return Ok(text.to_vec());
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
        KeyCommand::ChangePassphrase { home } => {
            let file = read_key_file(&path)?;
            let key = open(&path, &file, "QSM_PASSPHRASE_FILE")?;
            let pass = new_passphrase("QSM_NEW_PASSPHRASE_FILE")?;
            let new = key.wrap(&pass, KdfParams::DEFAULT)?;
            write_key_file(&path, &new, true)?;
            println!(
                "passphrase changed; fingerprint {} (the key itself is unchanged)",
                key.fingerprint()
            );
            // The server's copy, if it is this key under the old passphrase: a new machine
            // then needs the new passphrase, and the old one opens nothing.
            if home.has_store()? {
                let connected = home.open()?;
                let server = connected.server();
                if server.get_key()?.as_deref() == Some(file.as_bytes()) {
                    server.put_key(new.as_bytes())?;
                    println!("the copy on {} is rewrapped too", server.describe());
                }
            }
        }
        KeyCommand::Recover { home } => {
            if path.exists() {
                bail!(exists(&path));
            }
            let connected = home.open()?;
            let server = connected.server();
            let stored = server.get_key()?.with_context(|| {
                format!("{} holds no key file for this node", server.describe())
            })?;
            let file = KeyFile::from_bytes(&stored)
                .with_context(|| format!("the key file {} holds", server.describe()))?;
            let key = open(&path, &file, "QSM_PASSPHRASE_FILE")?;
            write_key_file(&path, &file, false)?;
            println!("key recovered from {} into {}", server.describe(), path.display());
            println!("fingerprint {}", key.fingerprint());
        }
        KeyCommand::Upload { replace, home } => {
            let file = read_key_file(&path)?;
            let key = open(&path, &file, "QSM_PASSPHRASE_FILE")?;
            let connected = home.open()?;
            let server = connected.server();
            match server.get_key()? {
                Some(stored) if stored != file.as_bytes() && !replace => bail!(
                    "{} holds another key file for this node; --replace to overwrite it",
                    server.describe()
                ),
                _ => server.put_key(file.as_bytes())?,
            }
            println!("key {} stored on {}", key.fingerprint(), server.describe());
        }
    }
    Ok(true)
}

/// What a command needs the node's key for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUse {
    /// A backup with encryption on: the key is opened, recovered from the server, or made on
    /// first use, and the server is given a copy.
    Backup,
    /// A restore: the key is opened if there is one and a passphrase can be had; `required`
    /// when encryption is configured on, so a missing passphrase is an error.
    Restore { required: bool },
}

/// The node's keys for a backup or a restore, asked before anything is read or written, so
/// a wrong passphrase stops the command at once.
pub fn node_keys(
    given: Option<PathBuf>,
    cipher: Option<&str>,
    server: &dyn Server,
    usage: KeyUse,
) -> Result<Option<Arc<NodeKeys>>> {
    let path = key_path(given)?;
    let aead = match cipher {
        None => Aead::Aes256Gcm,
        Some(name) => Aead::parse(name).with_context(|| {
            format!("unknown cipher {name:?}: aes-256-gcm or chacha20-poly1305")
        })?,
    };
    let env = "QSM_PASSPHRASE_FILE";
    let local = if path.exists() { Some(read_key_file(&path)?) } else { None };
    // A restore that may do without the key (nothing says encryption is on) goes on without
    // it when no passphrase can be asked; encrypted files then fail, each saying why.
    let no_passphrase =
        usage == (KeyUse::Restore { required: false }) && !passphrase_available(env);
    let (file, key, pass) = match (local, usage) {
        (Some(file), _) => {
            if no_passphrase {
                return Ok(None);
            }
            let pass = passphrase(env, "Passphrase: ")?;
            let key =
                file.unwrap_key(&pass).with_context(|| format!("key file {}", path.display()))?;
            (file, key, pass)
        }
        (None, _) => match server.get_key()? {
            // A new machine: the server's copy, opened with the passphrase, then kept here.
            Some(stored) => {
                if no_passphrase {
                    return Ok(None);
                }
                let file = KeyFile::from_bytes(&stored)
                    .with_context(|| format!("the key file {} holds", server.describe()))?;
                let pass = passphrase(env, "Passphrase: ")?;
                let key = file
                    .unwrap_key(&pass)
                    .with_context(|| format!("the key file {} holds", server.describe()))?;
                write_key_file(&path, &file, false)?;
                eprintln!(
                    "qsm: the node's key was fetched from {} into {}",
                    server.describe(),
                    path.display()
                );
                (file, key, pass)
            }
            None if usage == KeyUse::Backup => {
                // First use: a new key under a new passphrase.
                let pass = new_passphrase(env)?;
                let key = MasterKey::generate()?;
                let file = key.wrap(&pass, KdfParams::DEFAULT)?;
                write_key_file(&path, &file, false)?;
                eprintln!(
                    "qsm: a new key {} was made for this node in {}. Keep the passphrase safe: without it no one can restore this node's encrypted backups.",
                    key.fingerprint(),
                    path.display()
                );
                (file, key, pass)
            }
            None if usage == (KeyUse::Restore { required: true }) => bail!(
                "encryption is on, but there is no key at {} and {} holds none",
                path.display(),
                server.describe()
            ),
            None => return Ok(None),
        },
    };
    let keys = NodeKeys::new(&key, aead)?;
    if usage == KeyUse::Backup {
        qsm_client::keys::ensure_server_copy(server, &file, &pass, &keys.fingerprint)?;
    }
    Ok(Some(Arc::new(keys)))
}

/// Whether a passphrase can be had without failing: a file named by `env`, or a terminal.
fn passphrase_available(env: &str) -> bool {
    std::env::var_os(env).is_some()
        || std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty").is_ok()
}
