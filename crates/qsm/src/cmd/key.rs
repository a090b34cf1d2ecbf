//! `qsm key init | show-fingerprint | change-passphrase | recover | upload`, and the key
//! loading of backups and restores with encryption: the flags, where passphrases come from,
//! and the words; what is decided (which key file, when the server's copy is fetched, given,
//! or left alone) is `qsm_client::keyring`'s.
//!
//! Passphrases come from the terminal (not echoed), or from the file named by
//! `QSM_PASSPHRASE_FILE` (and `QSM_NEW_PASSPHRASE_FILE` for a new one, `QSM_OLD_PASSPHRASE_FILE`
//! for the one a stale key file is under) for scripts.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use qsm_client::ClientError;
use qsm_client::keyring::{
    Asked, Keyring, Notice, Passphrases, Purpose, StoredKey, describe_stored, key_path, when,
    wrapped,
};
use qsm_client::keys::NodeKeys;
use qsm_client::server::Server;

use crate::conn::Conn;

/// What backups and restores need the key for (the library's).
pub use qsm_client::keyring::KeyUse;

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
    /// Generate the node's master key and write it, wrapped under a new passphrase. Refused
    /// when the server (or the embedded store) already holds a key for the node, unless
    /// --force.
    Init {
        /// Make a new key even though the server holds one (which stays there until
        /// `qsm key upload --replace`).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        home: Conn,
    },
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
        /// Replace this machine's key file with the server's wrapping of the same key (after
        /// `qsm key change-passphrase` on another machine): asks the new passphrase, and
        /// refuses if the server's file is another key or an older wrapping.
        #[arg(long)]
        refresh: bool,
        #[command(flatten)]
        home: Conn,
    },
    /// Store this machine's key file on the server (backups with encryption do it by
    /// themselves when the server holds none).
    Upload {
        /// Replace a different key file the server holds (it may be the only copy of the key
        /// older backups were sealed with: be sure). Never puts an older wrapping of the same
        /// key over a newer one.
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        home: Conn,
    },
}

/// A passphrase from the file named by `env`, or from the terminal with `prompt`.
fn passphrase(env: &str, prompt: &str) -> Result<Vec<u8>> {
    if let Some(path) = std::env::var_os(env) {
        crate::conn::check_owner_only(Path::new(&path), &format!("passphrase file ({env})"))?;
        let text = std::fs::read(&path).map_err(|e| {
            crate::usage::usage(format!(
                "the passphrase file {} ({env}): {e}",
                Path::new(&path).display()
            ))
        })?;
        // One trailing newline is the file's, not the passphrase's.
        let text = text.strip_suffix(b"\n").unwrap_or(&text);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.is_empty() {
            return Err(crate::usage::usage(format!(
                "the passphrase file {} ({env}) is empty",
                Path::new(&path).display()
            )));
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
    // Before asking again: a refusal is better said after one passphrase than after two.
    qsm_client::keyring::check_new_passphrase(&first)?;
    if std::env::var_os(env).is_none() && passphrase(env, "The same again: ")? != first {
        bail!("the two passphrases differ; nothing was written");
    }
    Ok(first)
}

/// Whether a passphrase can be had without failing: a file named by `env`, or a terminal.
fn passphrase_available(env: &str) -> bool {
    std::env::var_os(env).is_some()
        || std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty").is_ok()
}

/// Passphrases from the files the environment names, else from the terminal.
#[derive(Debug)]
struct Asker;

impl Passphrases for Asker {
    fn current(&self, asked: Asked) -> qsm_client::Result<Vec<u8>> {
        let (env, prompt) = match asked {
            Asked::Key => ("QSM_PASSPHRASE_FILE", "Passphrase: "),
            Asked::Changed => {
                ("QSM_PASSPHRASE_FILE", "Passphrase (the server's copy's, the new one): ")
            }
            Asked::Old => {
                ("QSM_OLD_PASSPHRASE_FILE", "Passphrase of this machine's key file (the old one): ")
            }
        };
        passphrase(env, prompt).map_err(client_error)
    }

    fn new_one(&self, purpose: Purpose) -> qsm_client::Result<Vec<u8>> {
        let env = match purpose {
            Purpose::NewKey => "QSM_PASSPHRASE_FILE",
            Purpose::Change => "QSM_NEW_PASSPHRASE_FILE",
        };
        new_passphrase(env).map_err(client_error)
    }

    fn available(&self) -> bool {
        passphrase_available("QSM_PASSPHRASE_FILE")
    }
}

/// A passphrase that could not be had, in the library's terms: bad usage stays bad usage
/// (exit 2), and the message is the same.
fn client_error(e: anyhow::Error) -> ClientError {
    let text = crate::usage::chain(&e);
    if crate::usage::is_usage(&e) { ClientError::Usage(text) } else { ClientError::Invalid(text) }
}

/// Says `notice`: what backups and restores are told goes to stderr (their output is their
/// summary), what the key commands did to stdout.
fn say(notice: Notice) {
    match notice {
        Notice::Fetched { server, path } => {
            errln!("qsm: the node's key was fetched from {server} into {}", path.display())
        }
        Notice::Made { fingerprint, path } => errln!(
            "qsm: a new key {fingerprint} was made for this node in {}. Keep the passphrase safe: without it no one can restore this node's encrypted backups.",
            path.display()
        ),
        Notice::NewerPassphraseOnServer { server, fingerprint: fp, at, here } => errln!(
            "qsm: {server} holds this key ({fp}) under a newer passphrase, set {} (`qsm key \
             change-passphrase` on another machine?); this machine's file is under the old \
             one ({}). This backup goes on with the key. `qsm key recover --refresh`, with \
             the new passphrase, takes the server's wrapping, and the old passphrase then \
             opens nothing here.",
            when(at),
            wrapped(here)
        ),
        Notice::OlderPassphraseOnServer { server, fingerprint: fp, at, here } => errln!(
            "qsm: {server}'s copy of this key ({fp}, by what it says) is under another passphrase, \
             set {}, before this machine's ({}): that older passphrase still opens it there. \
             `qsm key upload --replace` puts this machine's wrapping on the server.",
            when(at),
            wrapped(here)
        ),
        Notice::NewerWrappingOnServer { server, fingerprint: fp } => errln!(
            "qsm: {server} holds this key ({fp}) under this passphrase, wrapped later than this \
             machine's file; `qsm key recover --refresh` takes it"
        ),
        Notice::KeyWritten { path, fingerprint } => {
            outln!("key written to {}", path.display());
            outln!("fingerprint {fingerprint}");
            outln!(
                "Keep the passphrase safe: without it no one, not even the server's administrator, can restore this node's encrypted backups."
            );
        }
        Notice::OtherKeyStillHeld { server, stored } => outln!(
            "{server} still holds the node's other key file ({}): backups with this \
             key are refused until `qsm key upload --replace` stores this one there",
            describe_stored(&stored)
        ),
        Notice::PassphraseChanged { fingerprint } => {
            outln!("passphrase changed; fingerprint {fingerprint} (the key itself is unchanged)")
        }
        Notice::CopyRewrapped { server } => outln!("the copy on {server} is rewrapped too"),
        Notice::CopyUnderOtherPassphrase { server, at } => outln!(
            "{server} holds this key under another passphrase (set {}), which the old one \
             does not open: left as it is; `qsm key upload --replace` puts this new \
             wrapping there",
            when(at)
        ),
        Notice::CopyOfOtherKey { server, stored } => outln!(
            "{server} holds another key file for this node ({}): left as it is",
            describe_stored(&stored)
        ),
        Notice::Recovered { server, path, fingerprint } => {
            outln!("key recovered from {server} into {}", path.display());
            outln!("fingerprint {fingerprint}");
        }
        Notice::AlreadyRefreshed { server, path } => {
            outln!("{} is already the key file {server} holds", path.display())
        }
        Notice::Refreshed { server, path, fingerprint, at } => outln!(
            "key {fingerprint} refreshed from {server} into {} (wrapped {}): the passphrase that opened \
             it is the one to use here now",
            path.display(),
            wrapped(at)
        ),
        Notice::AlreadyStored { server, fingerprint } => {
            outln!("{server} already holds this key file ({fingerprint})")
        }
        Notice::NewerWrappingKept { server, fingerprint, at, here } => outln!(
            "{server} already holds key {fingerprint} under this passphrase, wrapped later \
             ({}) than this machine's file ({}): left as it is",
            wrapped(at),
            wrapped(here)
        ),
        Notice::Stored { server, fingerprint } => {
            outln!("key {fingerprint} stored on {server}")
        }
    }
}

/// The fingerprint the node's key file states in clear (version 2), without its passphrase:
/// for `qsm journal status`, which must not ask for one. `None` without a readable v2 file.
pub fn stated_fingerprint(given: Option<PathBuf>) -> Option<String> {
    qsm_client::keyring::stated_fingerprint(&key_path(given).ok()?)
}

/// The node's keys for a backup or a restore (see `Keyring::node_keys`), asked before
/// anything is read or written.
pub fn node_keys(
    given: Option<PathBuf>,
    cipher: Option<&str>,
    server: &dyn Server,
    usage: KeyUse,
) -> Result<Option<Arc<NodeKeys>>> {
    let keyring = Keyring::new(key_path(given)?, &Asker);
    Ok(keyring.node_keys(server, cipher, usage, &mut say)?)
}

pub fn key(args: KeyArgs) -> Result<bool> {
    let keyring = Keyring::new(key_path(args.key_file)?, &Asker);
    match args.command {
        KeyCommand::Init { force, home } => {
            // Checked before asking anything, and again when writing.
            keyring.ensure_absent()?;
            let held = server_key(&home, force)?;
            keyring.init(held, force, &mut say)?;
        }
        KeyCommand::ShowFingerprint => outln!("{}", keyring.open()?.fingerprint()),
        KeyCommand::ChangePassphrase { home } => {
            let opened = keyring.open()?;
            // An unreachable server stops the change before anything is written.
            let connected = if home.has_store()? {
                Some(home.open().context(
                    "reaching the store that holds the node's key file; nothing was written (to \
                     change this machine's file alone, run without a server or store)",
                )?)
            } else {
                None
            };
            let server = connected.as_ref().map(|c| c.server());
            keyring.change_passphrase(opened, server.as_deref(), &mut say)?;
        }
        KeyCommand::Recover { refresh, home } => {
            let recovery = keyring.recovery(refresh)?;
            let connected = home.open()?;
            keyring.recover(recovery, connected.server().as_ref(), &mut say)?;
        }
        KeyCommand::Upload { replace, home } => {
            let opened = keyring.open()?;
            let connected = home.open()?;
            keyring.upload(opened, connected.server().as_ref(), replace, &mut say)?;
        }
    }
    Ok(true)
}

/// The key file the server holds for the node, when a store is configured; `key init` asks
/// before making a second key. With `force`, a server that cannot be reached is no reason to
/// stop.
fn server_key(home: &Conn, force: bool) -> Result<Option<StoredKey>> {
    if !home.has_store()? {
        return Ok(None);
    }
    let asked = home.open().and_then(|connected| {
        let server = connected.server();
        Ok(server.get_key()?.map(|bytes| StoredKey { server: server.describe(), bytes }))
    });
    match asked {
        Ok(held) => Ok(held),
        Err(_) if force => Ok(None),
        Err(e) => Err(e.context(
            "asking the server whether it already holds a key for this node (`qsm key init \
             --force` makes a key without asking)",
        )),
    }
}
