//! `qsm key init | show-fingerprint | change-passphrase | recover | upload`, and the key
//! loading of backups and restores with encryption: the node's master key, kept in a key
//! file wrapped under a passphrase (`qsm-crypt`, FORMAT.md §12). Losing the passphrase loses
//! every encrypted backup: nothing, on the client or the server, can open the key without it.
//!
//! Passphrases come from the terminal (not echoed), or from the file named by
//! `QSM_PASSPHRASE_FILE` (and `QSM_NEW_PASSPHRASE_FILE` for a new one, `QSM_OLD_PASSPHRASE_FILE`
//! for the one a stale key file is under) for scripts.
//!
//! Several machines of one node share its key through the server's copy of the key file. When
//! one of them changes the passphrase, the others' files stay under the old one: the server's
//! copy then says in clear (key file version 2) that it is the same key, wrapped later, so
//! they are told so, backups go on, and `qsm key recover --refresh` takes the new wrapping;
//! nothing puts an older wrapping back over a newer one (`qsm_client::keys::server_copy`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use qsm_client::keys::{NodeKeys, ServerCopy, server_copy};
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
    if first.len() < MIN_PASSPHRASE {
        return Err(crate::usage::usage(format!(
            "the passphrase is shorter than {MIN_PASSPHRASE} bytes"
        )));
    }
    if std::env::var_os(env).is_none() && passphrase(env, "The same again: ")? != first {
        bail!("the two passphrases differ; nothing was written");
    }
    Ok(first)
}

/// The fingerprint the node's key file states in clear (version 2), without its passphrase:
/// for `qsm journal status`, which must not ask for one. `None` without a readable v2 file.
pub fn stated_fingerprint(given: Option<PathBuf>) -> Option<String> {
    let bytes = std::fs::read(key_path(given).ok()?).ok()?;
    KeyFile::from_bytes(&bytes).ok()?.claimed_fingerprint()
}

fn read_key_file(path: &Path) -> Result<KeyFile> {
    // Missing, unreadable, or not a key file at all (another file named by mistake): bad
    // usage, exit 2.
    let bytes = std::fs::read(path).map_err(|e| {
        crate::usage::usage(format!(
            "the key file {}: {e} (make one with `qsm key init`)",
            path.display()
        ))
    })?;
    KeyFile::from_bytes(&bytes).map_err(|e| {
        crate::usage::usage(format!("the key file {} is not a QSM key file: {e}", path.display()))
    })
}

fn open(path: &Path, file: &KeyFile, env: &str) -> Result<MasterKey> {
    open_with(path, file, env).map(|(key, _)| key)
}

/// The key in `file`, and the passphrase that opened it.
fn open_with(path: &Path, file: &KeyFile, env: &str) -> Result<(MasterKey, Vec<u8>)> {
    let pass = passphrase(env, "Passphrase: ")?;
    let key = file.unwrap_key(&pass).with_context(|| format!("key file {}", path.display()))?;
    Ok((key, pass))
}

/// A time a key file states, for messages.
fn when(t: SystemTime) -> String {
    let secs =
        t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    format!("{} UTC", qsm_types::time::format_time(secs))
}

/// When `file` says it was wrapped, for messages.
fn wrapped(file: &KeyFile) -> String {
    match file.claimed_wrapped_at() {
        Some(t) => when(t),
        None => "at an unknown time (a version-1 key file, older than any version 2)".into(),
    }
}

/// What a key file the server holds says of itself, for messages: its claims, which only a
/// passphrase could confirm.
fn describe_stored(stored: &[u8]) -> String {
    match KeyFile::from_bytes(stored) {
        Ok(f) => match (f.claimed_fingerprint(), f.claimed_wrapped_at()) {
            (Some(fp), Some(at)) => format!("the key {fp}, wrapped {}", when(at)),
            _ => "a version-1 key file, which does not say which key it holds".into(),
        },
        Err(e) => format!("a file that is not a key file: {e}"),
    }
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
        // Owner-only (~/.config/qsm also holds client.toml, which may name a password file).
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
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
        KeyCommand::Init { force, home } => {
            if path.exists() {
                // Checked before asking anything, and again when writing.
                bail!(exists(&path));
            }
            let held = server_key(&home, force)?;
            if let Some((server, stored)) = &held
                && !force
            {
                bail!(
                    "{server} already holds a key file for this node ({}): a new key could not \
                     open the backups sealed with that one. To use that key on this machine, \
                     `qsm key recover` fetches it (it asks its passphrase). To make a new key \
                     anyway, `qsm key init --force`, then `qsm key upload --replace` to make it \
                     the node's key (keep the old key file while older backups are to stay \
                     restorable). Nothing was written.",
                    describe_stored(stored)
                );
            }
            let pass = new_passphrase("QSM_PASSPHRASE_FILE")?;
            let key = MasterKey::generate()?;
            write_key_file(&path, &key.wrap(&pass, KdfParams::DEFAULT)?, false)?;
            outln!("key written to {}", path.display());
            outln!("fingerprint {}", key.fingerprint());
            outln!(
                "Keep the passphrase safe: without it no one, not even the server's administrator, can restore this node's encrypted backups."
            );
            if let Some((server, stored)) = held {
                outln!(
                    "{server} still holds the node's other key file ({}): backups with this \
                     key are refused until `qsm key upload --replace` stores this one there",
                    describe_stored(&stored)
                );
            }
        }
        KeyCommand::ShowFingerprint => {
            let file = read_key_file(&path)?;
            outln!("{}", open(&path, &file, "QSM_PASSPHRASE_FILE")?.fingerprint());
        }
        KeyCommand::ChangePassphrase { home } => {
            let file = read_key_file(&path)?;
            let (key, old) = open_with(&path, &file, "QSM_PASSPHRASE_FILE")?;
            let fingerprint = key.fingerprint();
            // The server's copy is read first, so that the new wrapping is stamped after it
            // (whatever this machine's clock says) and an unreachable server stops the change
            // before anything is written.
            let connected = if home.has_store()? {
                Some(home.open().context(
                    "reaching the store that holds the node's key file; nothing was written (to \
                     change this machine's file alone, run without a server or store)",
                )?)
            } else {
                None
            };
            let server = connected.as_ref().map(|c| c.server());
            let stored = match &server {
                Some(s) => s.get_key()?,
                None => None,
            };
            let pass = new_passphrase("QSM_NEW_PASSPHRASE_FILE")?;
            let at = qsm_client::keys::rewrap_time(&file, stored.as_deref(), &fingerprint);
            let new = key.wrap_at(&pass, KdfParams::DEFAULT, at)?;
            write_key_file(&path, &new, true)?;
            outln!("passphrase changed; fingerprint {fingerprint} (the key itself is unchanged)");
            // The server's copy, if the old passphrase opens it to this key: a new machine
            // then needs the new passphrase, and the old one opens nothing. A copy it does not
            // open is left alone, whatever it claims.
            let Some(server) = server else {
                return Ok(true);
            };
            match server_copy(&file, &old, &fingerprint, stored.as_deref()) {
                ServerCopy::Same | ServerCopy::Opens { .. } => {
                    server.put_key(new.as_bytes())?;
                    outln!("the copy on {} is rewrapped too", server.describe());
                }
                // The next backup stores it.
                ServerCopy::Missing => {}
                ServerCopy::Rewrapped { at, .. } => outln!(
                    "{} holds this key under another passphrase (set {}), which the old one \
                     does not open: left as it is; `qsm key upload --replace` puts this new \
                     wrapping there",
                    server.describe(),
                    when(at)
                ),
                ServerCopy::Other { .. } => outln!(
                    "{} holds another key file for this node ({}): left as it is",
                    server.describe(),
                    describe_stored(stored.as_deref().unwrap_or_default())
                ),
            }
        }
        KeyCommand::Recover { refresh, home } => {
            if path.exists() {
                if !refresh {
                    bail!(
                        "{}; if the server holds this key under a newer passphrase (changed \
                         on another machine), `qsm key recover --refresh` takes it",
                        exists(&path)
                    );
                }
                let local = read_key_file(&path)?;
                let connected = home.open()?;
                return refresh_key(&path, &local, connected.server().as_ref()).map(|()| true);
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
            outln!("key recovered from {} into {}", server.describe(), path.display());
            outln!("fingerprint {}", key.fingerprint());
        }
        KeyCommand::Upload { replace, home } => {
            let file = read_key_file(&path)?;
            let (key, pass) = open_with(&path, &file, "QSM_PASSPHRASE_FILE")?;
            let fingerprint = key.fingerprint();
            let connected = home.open()?;
            let server = connected.server();
            let stored = server.get_key()?;
            let here = wrapped(&file);
            match server_copy(&file, &pass, &fingerprint, stored.as_deref()) {
                ServerCopy::Same => {
                    outln!("{} already holds this key file ({fingerprint})", server.describe());
                    return Ok(true);
                }
                ServerCopy::Opens { newer: true } => {
                    outln!(
                        "{} already holds key {fingerprint} under this passphrase, wrapped later \
                         ({}) than this machine's file ({here}): left as it is",
                        server.describe(),
                        wrapped(&KeyFile::from_bytes(stored.as_deref().unwrap_or_default())?)
                    );
                    return Ok(true);
                }
                // Putting an older wrapping back would let the passphrase it replaced (perhaps
                // compromised: that is why passphrases are changed) open the server's copy.
                ServerCopy::Rewrapped { at, newer: true } => bail!(
                    "{} holds this key ({fingerprint}) wrapped {} under another passphrase, \
                     after this machine's file ({here}): the passphrase was changed on another \
                     machine, and this older wrapping would bring the old passphrase back, so \
                     even --replace does not put it. `qsm key recover --refresh` takes the \
                     server's wrapping here (with the new passphrase); then \
                     `qsm key change-passphrase` if yet another passphrase is wanted. Nothing \
                     was written.",
                    server.describe(),
                    when(at)
                ),
                ServerCopy::Rewrapped { at, newer: false } if !replace => bail!(
                    "{} holds this key ({fingerprint}, by what its file says) under another \
                     passphrase, set {} before this machine's ({here}), which still opens it \
                     there; --replace puts this machine's wrapping instead",
                    server.describe(),
                    when(at)
                ),
                ServerCopy::Other { .. } if !replace => bail!(
                    "{} holds another key file for this node ({}); --replace to overwrite it",
                    server.describe(),
                    describe_stored(stored.as_deref().unwrap_or_default())
                ),
                _ => server.put_key(file.as_bytes())?,
            }
            outln!("key {fingerprint} stored on {}", server.describe());
        }
    }
    Ok(true)
}

/// The key file the server holds for the node, with the server's name, when a store is
/// configured; `key init` asks before making a second key. With `force`, a server that
/// cannot be reached is no reason to stop.
fn server_key(home: &Conn, force: bool) -> Result<Option<(String, Vec<u8>)>> {
    if !home.has_store()? {
        return Ok(None);
    }
    let asked = home.open().and_then(|connected| {
        let server = connected.server();
        Ok(server.get_key()?.map(|stored| (server.describe(), stored)))
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

/// `qsm key recover --refresh`: this machine's `local` key file replaced by the server's
/// wrapping of the same key, opened with the (new) passphrase first.
fn refresh_key(path: &Path, local: &KeyFile, server: &dyn Server) -> Result<()> {
    let stored = server.get_key()?.with_context(|| {
        format!(
            "{} holds no key file for this node: nothing to refresh from (`qsm key upload` \
             stores this machine's)",
            server.describe()
        )
    })?;
    if stored == local.as_bytes() {
        outln!("{} is already the key file {} holds", path.display(), server.describe());
        return Ok(());
    }
    let file = KeyFile::from_bytes(&stored)
        .with_context(|| format!("the key file {} holds", server.describe()))?;
    let pass =
        passphrase("QSM_PASSPHRASE_FILE", "Passphrase (the server's copy's, the new one): ")?;
    let key = file.unwrap_key(&pass).with_context(|| {
        format!(
            "the key file {} holds (wrapped {}): give the passphrase it was changed to",
            server.describe(),
            wrapped(&file)
        )
    })?;
    let fingerprint = key.fingerprint();
    // Which key this machine holds, so that no other key replaces it: the passphrase may open
    // the local file too; else a version-2 file names its key (a name that is not its key's
    // makes the file open under no passphrase, so believing it loses nothing that could
    // open); a version-1 file needs its own, older passphrase.
    let here = match local.unwrap_key(&pass) {
        Ok(k) => k.fingerprint(),
        Err(_) => match local.claimed_fingerprint() {
            Some(fp) => fp,
            None => {
                let old = passphrase(
                    "QSM_OLD_PASSPHRASE_FILE",
                    "Passphrase of this machine's key file (the old one): ",
                )?;
                local
                    .unwrap_key(&old)
                    .with_context(|| {
                        format!(
                            "key file {} (a version-1 file: its own passphrase tells which key \
                             it holds)",
                            path.display()
                        )
                    })?
                    .fingerprint()
            }
        },
    };
    if here != fingerprint {
        bail!(
            "{} holds the key {fingerprint}, not this machine's key {here}: refreshing would \
             lose this machine's key and what was sealed with it. Nothing was written. If the \
             server's key is the one to use, move {} aside and run `qsm key recover`.",
            server.describe(),
            path.display()
        );
    }
    if file.claimed_wrapped_at() < local.claimed_wrapped_at() {
        bail!(
            "{}'s copy of this key was wrapped {}, before this machine's file ({}): refreshing \
             would go back to an older wrapping. Nothing was written; `qsm key upload \
             --replace` puts this machine's wrapping on the server.",
            server.describe(),
            wrapped(&file),
            wrapped(local)
        );
    }
    write_key_file(path, &file, true)?;
    outln!(
        "key {fingerprint} refreshed from {} into {} (wrapped {}): the passphrase that opened \
         it is the one to use here now",
        server.describe(),
        path.display(),
        wrapped(&file)
    );
    Ok(())
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
        Some(name) => Aead::parse(name).ok_or_else(|| {
            crate::usage::usage(format!(
                "cipher {name:?} in the client configuration: aes-256-gcm or chacha20-poly1305"
            ))
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
                errln!(
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
                errln!(
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
        let found = qsm_client::keys::ensure_server_copy(server, &file, &pass, &keys.fingerprint)?;
        // Said once per backup, before it starts; the backup goes on with this key either way.
        let fp = &keys.fingerprint;
        match found {
            ServerCopy::Rewrapped { at, newer: true } => errln!(
                "qsm: {} holds this key ({fp}) under a newer passphrase, set {} (`qsm key \
                 change-passphrase` on another machine?); this machine's file is under the old \
                 one ({}). This backup goes on with the key. `qsm key recover --refresh`, with \
                 the new passphrase, takes the server's wrapping, and the old passphrase then \
                 opens nothing here.",
                server.describe(),
                when(at),
                wrapped(&file)
            ),
            ServerCopy::Rewrapped { at, newer: false } => errln!(
                "qsm: {}'s copy of this key ({fp}, by what it says) is under another passphrase, \
                 set {}, before this machine's ({}): that older passphrase still opens it there. \
                 `qsm key upload --replace` puts this machine's wrapping on the server.",
                server.describe(),
                when(at),
                wrapped(&file)
            ),
            ServerCopy::Opens { newer: true } => errln!(
                "qsm: {} holds this key ({fp}) under this passphrase, wrapped later than this \
                 machine's file; `qsm key recover --refresh` takes it",
                server.describe()
            ),
            ServerCopy::Missing
            | ServerCopy::Same
            | ServerCopy::Opens { newer: false }
            | ServerCopy::Other { .. } => {}
        }
    }
    Ok(Some(Arc::new(keys)))
}

/// Whether a passphrase can be had without failing: a file named by `env`, or a terminal.
fn passphrase_available(env: &str) -> bool {
    std::env::var_os(env).is_some()
        || std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty").is_ok()
}
