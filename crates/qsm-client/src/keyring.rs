//! Where the node's master key is kept, and what the key commands decide: this machine's key
//! file (where it is, reading it, writing it whole and owner-only), the server's copy (fetched
//! on a new machine, given on the first backup, never put back over a newer wrapping), and the
//! decisions of `qsm key init | change-passphrase | recover | upload`. The key file is wrapped
//! under a passphrase (`qsm-crypt`, FORMAT.md §12): losing the passphrase loses every
//! encrypted backup, since nothing, on the client or the server, opens the key without it.
//!
//! Nothing here prompts or prints, so that another front end (or a test) can drive the same
//! decisions. Passphrases are asked through [`Passphrases`], which the caller implements (the
//! CLI: a terminal with echo off, or the files environment variables name). What the user is
//! to be told arrives as [`Notice`]s at the moment it happens, for the caller to word: a key
//! made on the first backup is said even when reaching the server fails right after. Errors
//! are worded here, as [`crate::keys::ensure_server_copy`]'s are; [`ClientError::Usage`] marks
//! the ones about how the command was given (a key file that is none, a passphrase too short).
//!
//! Several machines of one node share its key through the server's copy of the key file. When
//! one of them changes the passphrase, the others' files stay under the old one: the server's
//! copy then says in clear (key file version 2) that it is the same key, wrapped later, so
//! they are told so ([`Notice::NewerPassphraseOnServer`]), backups go on, and a refresh
//! ([`Recovery::Refresh`]) takes the new wrapping; nothing puts an older wrapping back over a
//! newer one ([`crate::keys::server_copy`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use qsm_crypt::{Aead, CryptError, KdfParams, KeyFile, MasterKey};

use crate::error::{ClientError, Result, chain};
use crate::keys::{NodeKeys, ServerCopy, ensure_server_copy, rewrap_time, server_copy};
use crate::private::{make_parent, write_private};
use crate::server::Server;

/// Shortest passphrase accepted for a new key: short ones fall to a guessing attack on a
/// stolen key file, argon2 or not.
pub const MIN_PASSPHRASE: usize = 8;

/// Which passphrase of an existing key file is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// The passphrase of the node's key file (this machine's, or the server's copy).
    Key,
    /// The passphrase the server's copy was changed to on another machine (a refresh).
    Changed,
    /// The older passphrase of this machine's version-1 file, asked only when the changed one
    /// does not open it: such a file does not say which key it holds, and only opening it
    /// tells.
    Old,
}

/// What a new passphrase is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A new key: `qsm key init`, or the first backup with encryption.
    NewKey,
    /// The passphrase an existing key is rewrapped under (`qsm key change-passphrase`).
    Change,
}

/// Where passphrases come from: the caller's to decide (a terminal, files, a test's table).
pub trait Passphrases {
    /// The passphrase `asked` for. Whether it opens anything is checked here, not there.
    fn current(&self, asked: Asked) -> Result<Vec<u8>>;
    /// A new passphrase, for `purpose`. It is refused when shorter than [`MIN_PASSPHRASE`]
    /// ([`check_new_passphrase`], which an implementation asking twice should call before
    /// asking again).
    fn new_one(&self, purpose: Purpose) -> Result<Vec<u8>>;
    /// Whether [`Passphrases::current`] can answer `Asked::Key` without failing: a restore
    /// that may do without the key goes on without it when no one can be asked.
    fn available(&self) -> bool;
}

/// Refuses a new passphrase shorter than [`MIN_PASSPHRASE`] (bad usage).
pub fn check_new_passphrase(passphrase: &[u8]) -> Result<()> {
    if passphrase.len() < MIN_PASSPHRASE {
        return Err(ClientError::Usage(format!(
            "the passphrase is shorter than {MIN_PASSPHRASE} bytes"
        )));
    }
    Ok(())
}

/// What the user is to be told, said by [`Keyring`]'s operations as it happens. Each names the
/// server by its description ([`Server::describe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A machine without a key file took the server's copy, opened with the passphrase, into
    /// `path`.
    Fetched {
        /// The server.
        server: String,
        /// The key file written.
        path: PathBuf,
    },
    /// The first backup with encryption made the node's key, into `path`.
    Made {
        /// The new key's fingerprint.
        fingerprint: String,
        /// The key file written.
        path: PathBuf,
    },
    /// A backup found the server holding this key under a passphrase set on another machine
    /// after this machine's (`at`; `here`, this machine's file's wrapping, `None` for a
    /// version-1 file): the backup goes on, and a refresh takes the server's wrapping.
    NewerPassphraseOnServer {
        /// The server.
        server: String,
        /// The key's fingerprint.
        fingerprint: String,
        /// When the server's copy says it was wrapped.
        at: SystemTime,
        /// When this machine's file says it was wrapped.
        here: Option<SystemTime>,
    },
    /// A backup found the server holding this key, by what its file says, under an older,
    /// other passphrase (set `at`), which still opens it there.
    OlderPassphraseOnServer {
        /// The server.
        server: String,
        /// The key's fingerprint.
        fingerprint: String,
        /// When the server's copy says it was wrapped.
        at: SystemTime,
        /// When this machine's file says it was wrapped.
        here: Option<SystemTime>,
    },
    /// A backup found the server holding this key under this passphrase, wrapped later than
    /// this machine's file (left as it is).
    NewerWrappingOnServer {
        /// The server.
        server: String,
        /// The key's fingerprint.
        fingerprint: String,
    },
    /// `qsm key init` wrote a new key into `path`.
    KeyWritten {
        /// The key file.
        path: PathBuf,
        /// The new key's fingerprint.
        fingerprint: String,
    },
    /// `qsm key init --force` made a key although the server holds another node key file
    /// (`stored`), which stays there.
    OtherKeyStillHeld {
        /// The server.
        server: String,
        /// The file the server holds (see [`describe_stored`]).
        stored: Vec<u8>,
    },
    /// This machine's key file is rewrapped under the new passphrase.
    PassphraseChanged {
        /// The key's fingerprint (unchanged).
        fingerprint: String,
    },
    /// The server's copy is rewrapped under the new passphrase too.
    CopyRewrapped {
        /// The server.
        server: String,
    },
    /// The server holds this key under a passphrase (set `at`) the old one does not open:
    /// left as it is.
    CopyUnderOtherPassphrase {
        /// The server.
        server: String,
        /// When the server's copy says it was wrapped.
        at: SystemTime,
    },
    /// The server holds another key file (`stored`), left as it is.
    CopyOfOtherKey {
        /// The server.
        server: String,
        /// The file the server holds (see [`describe_stored`]).
        stored: Vec<u8>,
    },
    /// The server's copy was recovered into `path`.
    Recovered {
        /// The server.
        server: String,
        /// The key file written.
        path: PathBuf,
        /// The key's fingerprint.
        fingerprint: String,
    },
    /// A refresh found this machine's file already the server's, byte for byte.
    AlreadyRefreshed {
        /// The server.
        server: String,
        /// The key file.
        path: PathBuf,
    },
    /// A refresh replaced this machine's file with the server's wrapping (made `at`).
    Refreshed {
        /// The server.
        server: String,
        /// The key file written.
        path: PathBuf,
        /// The key's fingerprint.
        fingerprint: String,
        /// When the server's copy says it was wrapped.
        at: Option<SystemTime>,
    },
    /// An upload found the server holding this very file.
    AlreadyStored {
        /// The server.
        server: String,
        /// The key's fingerprint.
        fingerprint: String,
    },
    /// An upload found the server holding this key under this passphrase, wrapped later
    /// (`at`) than this machine's file (`here`): left as it is.
    NewerWrappingKept {
        /// The server.
        server: String,
        /// The key's fingerprint.
        fingerprint: String,
        /// When the server's copy says it was wrapped.
        at: Option<SystemTime>,
        /// When this machine's file says it was wrapped.
        here: Option<SystemTime>,
    },
    /// This machine's key file is stored on the server.
    Stored {
        /// The server.
        server: String,
        /// The key's fingerprint.
        fingerprint: String,
    },
}

/// What a command needs the node's key for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUse {
    /// A backup with encryption on: the key is opened, recovered from the server, or made on
    /// first use, and the server is given a copy.
    Backup,
    /// A restore: the key is opened if there is one and a passphrase can be had; `required`
    /// when encryption is configured on, so a missing passphrase is an error.
    Restore {
        /// Encryption is configured on: no key is an error.
        required: bool,
    },
}

/// A key file the server holds, as found before a new key is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    /// The server, for messages.
    pub server: String,
    /// The file's bytes.
    pub bytes: Vec<u8>,
}

/// This machine's key file, opened with its passphrase: what a command that changes or
/// uploads the file asks before it reaches the server, so that a wrong passphrase stops it
/// first.
pub struct Opened {
    file: KeyFile,
    key: MasterKey,
    passphrase: Vec<u8>,
}

impl Opened {
    /// The key's fingerprint.
    pub fn fingerprint(&self) -> String {
        self.key.fingerprint()
    }
}

/// Not the passphrase, nor the key.
impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened").field("key", &self.key).finish_non_exhaustive()
    }
}

/// What `qsm key recover` is to do, decided from this machine's key file before the server
/// is reached.
#[derive(Debug)]
pub enum Recovery {
    /// No key file here: the server's copy is fetched.
    Fetch,
    /// This machine's file (held here) is to be replaced by the server's later wrapping of
    /// the same key.
    Refresh(KeyFile),
}

/// The key file at `given`, else `$QSM_KEY_FILE`, else `~/.config/qsm/key`.
pub fn key_path(given: Option<PathBuf>) -> Result<PathBuf> {
    key_path_from(given, std::env::var_os("QSM_KEY_FILE"), std::env::var_os("HOME"))
}

/// [`key_path`] with the environment given, so its order can be tested.
fn key_path_from(
    given: Option<PathBuf>,
    env: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Result<PathBuf> {
    if let Some(p) = given.or_else(|| env.map(PathBuf::from)) {
        return Ok(p);
    }
    match home {
        Some(h) => Ok(PathBuf::from(h).join(".config/qsm/key")),
        None => Err(ClientError::Invalid(
            "neither --key-file, QSM_KEY_FILE nor HOME is set: say where the key file is".into(),
        )),
    }
}

/// The fingerprint the key file at `path` states in clear (version 2), without its
/// passphrase: for status reports, which must not ask for one. `None` without a readable v2
/// file.
pub fn stated_fingerprint(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    KeyFile::from_bytes(&bytes).ok()?.claimed_fingerprint()
}

/// The cipher named in the client configuration (default AES-256-GCM).
pub fn cipher(name: Option<&str>) -> Result<Aead> {
    match name {
        None => Ok(Aead::Aes256Gcm),
        Some(name) => Aead::parse(name).ok_or_else(|| {
            ClientError::Usage(format!(
                "cipher {name:?} in the client configuration: aes-256-gcm or chacha20-poly1305"
            ))
        }),
    }
}

/// A time a key file states, for messages.
pub fn when(t: SystemTime) -> String {
    let secs =
        t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    format!("{} UTC", qsm_types::time::format_time(secs))
}

/// When a key file says it was wrapped (`at`, its [`KeyFile::claimed_wrapped_at`]), for
/// messages.
pub fn wrapped(at: Option<SystemTime>) -> String {
    match at {
        Some(t) => when(t),
        None => "at an unknown time (a version-1 key file, older than any version 2)".into(),
    }
}

/// What a key file the server holds says of itself, for messages: its claims, which only a
/// passphrase could confirm.
pub fn describe_stored(stored: &[u8]) -> String {
    match KeyFile::from_bytes(stored) {
        Ok(f) => match (f.claimed_fingerprint(), f.claimed_wrapped_at()) {
            (Some(fp), Some(at)) => format!("the key {fp}, wrapped {}", when(at)),
            _ => "a version-1 key file, which does not say which key it holds".into(),
        },
        Err(e) => format!("a file that is not a key file: {e}"),
    }
}

/// `what` failed with `e`: the message with `e`'s causes, each once.
fn failed(what: String, e: impl std::error::Error + 'static) -> ClientError {
    ClientError::Invalid(format!("{what}: {}", chain(&e)))
}

/// A key could not be made or wrapped (no randomness, parameters argon2 refuses).
fn crypt(e: CryptError) -> ClientError {
    ClientError::Invalid(e.to_string())
}

/// The node's key file on this machine, and where its passphrases come from.
pub struct Keyring<'a> {
    path: PathBuf,
    passphrases: &'a dyn Passphrases,
    /// How new wrappings are derived: [`KdfParams::DEFAULT`]; tests use cheap ones.
    kdf: KdfParams,
}

impl std::fmt::Debug for Keyring<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring").field("path", &self.path).finish_non_exhaustive()
    }
}

impl<'a> Keyring<'a> {
    /// The key file at `path` (see [`key_path`]), with passphrases from `passphrases`.
    pub fn new(path: PathBuf, passphrases: &'a dyn Passphrases) -> Keyring<'a> {
        Keyring { path, passphrases, kdf: KdfParams::DEFAULT }
    }

    /// The key file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This machine's key file. Missing, unreadable, or not a key file at all (another file
    /// named by mistake): bad usage.
    pub fn read(&self) -> Result<KeyFile> {
        let path = &self.path;
        let bytes = std::fs::read(path).map_err(|e| {
            ClientError::Usage(format!(
                "the key file {}: {e} (make one with `qsm key init`)",
                path.display()
            ))
        })?;
        KeyFile::from_bytes(&bytes).map_err(|e| {
            ClientError::Usage(format!(
                "the key file {} is not a QSM key file: {e}",
                path.display()
            ))
        })
    }

    /// This machine's key file, opened with its passphrase.
    pub fn open(&self) -> Result<Opened> {
        let file = self.read()?;
        let passphrase = self.passphrases.current(Asked::Key)?;
        let key = file
            .unwrap_key(&passphrase)
            .map_err(|e| failed(format!("key file {}", self.path.display()), e))?;
        Ok(Opened { file, key, passphrase })
    }

    /// Refuses to go on when the key file exists: a new key could not open what the one
    /// there sealed. `qsm key init` asks before it reaches the server.
    pub fn ensure_absent(&self) -> Result<()> {
        if self.path.exists() { Err(ClientError::Invalid(self.exists())) } else { Ok(()) }
    }

    fn exists(&self) -> String {
        format!(
            "{} exists: a key is already set up here (a new one could not open earlier backups)",
            self.path.display()
        )
    }

    /// A new passphrase for `purpose`, checked whatever [`Passphrases`] checked.
    fn new_passphrase(&self, purpose: Purpose) -> Result<Vec<u8>> {
        let passphrase = self.passphrases.new_one(purpose)?;
        check_new_passphrase(&passphrase)?;
        Ok(passphrase)
    }

    /// `qsm key init`: a new key under a new passphrase, written here. `held` is the key file
    /// the server holds for the node, if any: refused unless `force`, since a second key
    /// could not open what the first sealed, and backups with this one are refused until it
    /// replaces the server's.
    pub fn init(
        &self,
        held: Option<StoredKey>,
        force: bool,
        notify: &mut dyn FnMut(Notice),
    ) -> Result<()> {
        if let Some(held) = &held
            && !force
        {
            return Err(ClientError::Invalid(format!(
                "{} already holds a key file for this node ({}): a new key could not \
                 open the backups sealed with that one. To use that key on this machine, \
                 `qsm key recover` fetches it (it asks its passphrase). To make a new key \
                 anyway, `qsm key init --force`, then `qsm key upload --replace` to make it \
                 the node's key (keep the old key file while older backups are to stay \
                 restorable). Nothing was written.",
                held.server,
                describe_stored(&held.bytes)
            )));
        }
        let passphrase = self.new_passphrase(Purpose::NewKey)?;
        let key = MasterKey::generate().map_err(crypt)?;
        self.write(&key.wrap(&passphrase, self.kdf).map_err(crypt)?, false)?;
        notify(Notice::KeyWritten { path: self.path.clone(), fingerprint: key.fingerprint() });
        if let Some(held) = held {
            notify(Notice::OtherKeyStillHeld { server: held.server, stored: held.bytes });
        }
        Ok(())
    }

    /// `qsm key change-passphrase`: `opened` rewrapped under a new passphrase, here and on
    /// `server` when one holds the node's key. The server's copy is read before the new
    /// passphrase is asked, so that the new wrapping is stamped after it (whatever this
    /// machine's clock says), and it is rewrapped only if the old passphrase opens it to this
    /// key: a new machine then needs the new passphrase, and the old one opens nothing. A copy
    /// it does not open is left alone, whatever it claims.
    pub fn change_passphrase(
        &self,
        opened: Opened,
        server: Option<&dyn Server>,
        notify: &mut dyn FnMut(Notice),
    ) -> Result<()> {
        let fingerprint = opened.fingerprint();
        let stored = match server {
            Some(s) => s.get_key()?,
            None => None,
        };
        let passphrase = self.new_passphrase(Purpose::Change)?;
        let at = rewrap_time(&opened.file, stored.as_deref(), &fingerprint);
        let new = opened.key.wrap_at(&passphrase, self.kdf, at).map_err(crypt)?;
        self.write(&new, true)?;
        notify(Notice::PassphraseChanged { fingerprint: fingerprint.clone() });
        let Some(server) = server else {
            return Ok(());
        };
        match server_copy(&opened.file, &opened.passphrase, &fingerprint, stored.as_deref()) {
            ServerCopy::Same | ServerCopy::Opens { .. } => {
                server.put_key(new.as_bytes())?;
                notify(Notice::CopyRewrapped { server: server.describe() });
            }
            // The next backup stores it.
            ServerCopy::Missing => {}
            ServerCopy::Rewrapped { at, .. } => {
                notify(Notice::CopyUnderOtherPassphrase { server: server.describe(), at })
            }
            ServerCopy::Other { .. } => notify(Notice::CopyOfOtherKey {
                server: server.describe(),
                stored: stored.unwrap_or_default(),
            }),
        }
        Ok(())
    }

    /// What `qsm key recover` is to do: fetch when there is no key file here; with
    /// `refresh`, replace the one here (read now: a file that is none is refused before the
    /// server is reached).
    pub fn recovery(&self, refresh: bool) -> Result<Recovery> {
        if !self.path.exists() {
            return Ok(Recovery::Fetch);
        }
        if !refresh {
            return Err(ClientError::Invalid(format!(
                "{}; if the server holds this key under a newer passphrase (changed \
                 on another machine), `qsm key recover --refresh` takes it",
                self.exists()
            )));
        }
        Ok(Recovery::Refresh(self.read()?))
    }

    /// `qsm key recover`: the server's copy, opened with the passphrase (so only its owner can
    /// use it), written here; or, to refresh, this machine's file replaced by the server's
    /// later wrapping of the same key (refused when it is another key or an older wrapping).
    pub fn recover(
        &self,
        recovery: Recovery,
        server: &dyn Server,
        notify: &mut dyn FnMut(Notice),
    ) -> Result<()> {
        if let Recovery::Refresh(local) = recovery {
            return self.refresh(&local, server, notify);
        }
        let stored = server.get_key()?.ok_or_else(|| {
            ClientError::Invalid(format!("{} holds no key file for this node", server.describe()))
        })?;
        let file = KeyFile::from_bytes(&stored)
            .map_err(|e| failed(format!("the key file {} holds", server.describe()), e))?;
        let passphrase = self.passphrases.current(Asked::Key)?;
        let key = file
            .unwrap_key(&passphrase)
            .map_err(|e| failed(format!("key file {}", self.path.display()), e))?;
        self.write(&file, false)?;
        notify(Notice::Recovered {
            server: server.describe(),
            path: self.path.clone(),
            fingerprint: key.fingerprint(),
        });
        Ok(())
    }

    /// `qsm key recover --refresh`: this machine's `local` key file replaced by the server's
    /// wrapping of the same key, opened with the (new) passphrase first. Refused when the
    /// server's file is another key (this machine's would be lost) or an older wrapping (the
    /// passphrase it replaced would open the key again).
    fn refresh(
        &self,
        local: &KeyFile,
        server: &dyn Server,
        notify: &mut dyn FnMut(Notice),
    ) -> Result<()> {
        let path = &self.path;
        let stored = server.get_key()?.ok_or_else(|| {
            ClientError::Invalid(format!(
                "{} holds no key file for this node: nothing to refresh from (`qsm key upload` \
                 stores this machine's)",
                server.describe()
            ))
        })?;
        if stored == local.as_bytes() {
            notify(Notice::AlreadyRefreshed { server: server.describe(), path: path.clone() });
            return Ok(());
        }
        let file = KeyFile::from_bytes(&stored)
            .map_err(|e| failed(format!("the key file {} holds", server.describe()), e))?;
        let passphrase = self.passphrases.current(Asked::Changed)?;
        let key = file.unwrap_key(&passphrase).map_err(|e| {
            failed(
                format!(
                    "the key file {} holds (wrapped {}): give the passphrase it was changed to",
                    server.describe(),
                    wrapped(file.claimed_wrapped_at())
                ),
                e,
            )
        })?;
        let fingerprint = key.fingerprint();
        // Which key this machine holds, so that no other key replaces it: the passphrase may
        // open the local file too; else a version-2 file names its key (a name that is not its
        // key's makes the file open under no passphrase, so believing it loses nothing that
        // could open); a version-1 file needs its own, older passphrase.
        let here = match local.unwrap_key(&passphrase) {
            Ok(k) => k.fingerprint(),
            Err(_) => match local.claimed_fingerprint() {
                Some(fp) => fp,
                None => {
                    let old = self.passphrases.current(Asked::Old)?;
                    local
                        .unwrap_key(&old)
                        .map_err(|e| {
                            failed(
                                format!(
                                    "key file {} (a version-1 file: its own passphrase tells \
                                     which key it holds)",
                                    path.display()
                                ),
                                e,
                            )
                        })?
                        .fingerprint()
                }
            },
        };
        if here != fingerprint {
            return Err(ClientError::Invalid(format!(
                "{} holds the key {fingerprint}, not this machine's key {here}: refreshing would \
                 lose this machine's key and what was sealed with it. Nothing was written. If \
                 the server's key is the one to use, move {} aside and run `qsm key recover`.",
                server.describe(),
                path.display()
            )));
        }
        if file.claimed_wrapped_at() < local.claimed_wrapped_at() {
            return Err(ClientError::Invalid(format!(
                "{}'s copy of this key was wrapped {}, before this machine's file ({}): \
                 refreshing would go back to an older wrapping. Nothing was written; `qsm key \
                 upload --replace` puts this machine's wrapping on the server.",
                server.describe(),
                wrapped(file.claimed_wrapped_at()),
                wrapped(local.claimed_wrapped_at())
            )));
        }
        self.write(&file, true)?;
        notify(Notice::Refreshed {
            server: server.describe(),
            path: path.clone(),
            fingerprint,
            at: file.claimed_wrapped_at(),
        });
        Ok(())
    }

    /// `qsm key upload`: `opened`'s file stored on `server`. A different key file there is
    /// replaced only with `replace` (it may be the only copy of the key older backups were
    /// sealed with); an older wrapping of this key never goes back over a newer one, even
    /// with `replace`: it would let the passphrase it replaced (perhaps compromised: that is
    /// why passphrases are changed) open the server's copy.
    pub fn upload(
        &self,
        opened: Opened,
        server: &dyn Server,
        replace: bool,
        notify: &mut dyn FnMut(Notice),
    ) -> Result<()> {
        let fingerprint = opened.fingerprint();
        let stored = server.get_key()?;
        let here = wrapped(opened.file.claimed_wrapped_at());
        match server_copy(&opened.file, &opened.passphrase, &fingerprint, stored.as_deref()) {
            ServerCopy::Same => {
                notify(Notice::AlreadyStored { server: server.describe(), fingerprint });
                return Ok(());
            }
            ServerCopy::Opens { newer: true } => {
                let at = stored
                    .as_deref()
                    .and_then(|b| KeyFile::from_bytes(b).ok())
                    .and_then(|f| f.claimed_wrapped_at());
                notify(Notice::NewerWrappingKept {
                    server: server.describe(),
                    fingerprint,
                    at,
                    here: opened.file.claimed_wrapped_at(),
                });
                return Ok(());
            }
            ServerCopy::Rewrapped { at, newer: true } => {
                return Err(ClientError::Invalid(format!(
                    "{} holds this key ({fingerprint}) wrapped {} under another passphrase, \
                     after this machine's file ({here}): the passphrase was changed on another \
                     machine, and this older wrapping would bring the old passphrase back, so \
                     even --replace does not put it. `qsm key recover --refresh` takes the \
                     server's wrapping here (with the new passphrase); then \
                     `qsm key change-passphrase` if yet another passphrase is wanted. Nothing \
                     was written.",
                    server.describe(),
                    when(at)
                )));
            }
            ServerCopy::Rewrapped { at, newer: false } if !replace => {
                return Err(ClientError::Invalid(format!(
                    "{} holds this key ({fingerprint}, by what its file says) under another \
                     passphrase, set {} before this machine's ({here}), which still opens it \
                     there; --replace puts this machine's wrapping instead",
                    server.describe(),
                    when(at)
                )));
            }
            ServerCopy::Other { .. } if !replace => {
                return Err(ClientError::Invalid(format!(
                    "{} holds another key file for this node ({}); --replace to overwrite it",
                    server.describe(),
                    describe_stored(stored.as_deref().unwrap_or_default())
                )));
            }
            _ => server.put_key(opened.file.as_bytes())?,
        }
        notify(Notice::Stored { server: server.describe(), fingerprint });
        Ok(())
    }

    /// The node's keys for a backup or a restore (`usage`), asked before anything is read or
    /// written, so a wrong passphrase stops the command at once; frames are sealed with the
    /// `cipher` named in the configuration. Without a key file here, the server's copy is
    /// fetched (a new machine), or, for a backup, a new key is made (the first backup). A
    /// backup then makes sure the server holds a copy ([`ensure_server_copy`]).
    ///
    /// `None`: a restore that may do without the key (nothing says encryption is on) and that
    /// finds none, or no one to ask its passphrase; encrypted files then fail, each saying why.
    pub fn node_keys(
        &self,
        server: &dyn Server,
        cipher_name: Option<&str>,
        usage: KeyUse,
        notify: &mut dyn FnMut(Notice),
    ) -> Result<Option<Arc<NodeKeys>>> {
        let path = &self.path;
        let aead = cipher(cipher_name)?;
        let local = if path.exists() { Some(self.read()?) } else { None };
        let no_passphrase =
            usage == (KeyUse::Restore { required: false }) && !self.passphrases.available();
        let (file, key, passphrase) = match local {
            Some(file) => {
                if no_passphrase {
                    return Ok(None);
                }
                let passphrase = self.passphrases.current(Asked::Key)?;
                let key = file
                    .unwrap_key(&passphrase)
                    .map_err(|e| failed(format!("key file {}", path.display()), e))?;
                (file, key, passphrase)
            }
            None => match server.get_key()? {
                // A new machine: the server's copy, opened with the passphrase, then kept here.
                Some(stored) => {
                    if no_passphrase {
                        return Ok(None);
                    }
                    let held = || format!("the key file {} holds", server.describe());
                    let file = KeyFile::from_bytes(&stored).map_err(|e| failed(held(), e))?;
                    let passphrase = self.passphrases.current(Asked::Key)?;
                    let key = file.unwrap_key(&passphrase).map_err(|e| failed(held(), e))?;
                    self.write(&file, false)?;
                    notify(Notice::Fetched { server: server.describe(), path: path.clone() });
                    (file, key, passphrase)
                }
                None if usage == KeyUse::Backup => {
                    // First use: a new key under a new passphrase.
                    let passphrase = self.new_passphrase(Purpose::NewKey)?;
                    let key = MasterKey::generate().map_err(crypt)?;
                    let file = key.wrap(&passphrase, self.kdf).map_err(crypt)?;
                    self.write(&file, false)?;
                    notify(Notice::Made { fingerprint: key.fingerprint(), path: path.clone() });
                    (file, key, passphrase)
                }
                None if usage == (KeyUse::Restore { required: true }) => {
                    return Err(ClientError::Invalid(format!(
                        "encryption is on, but there is no key at {} and {} holds none",
                        path.display(),
                        server.describe()
                    )));
                }
                None => return Ok(None),
            },
        };
        let keys = NodeKeys::new(&key, aead)?;
        if usage == KeyUse::Backup {
            let found = ensure_server_copy(server, &file, &passphrase, &keys.fingerprint)?;
            // Said once per backup, before it starts; the backup goes on with this key either
            // way.
            let fingerprint = keys.fingerprint.clone();
            let here = file.claimed_wrapped_at();
            match found {
                ServerCopy::Rewrapped { at, newer: true } => {
                    notify(Notice::NewerPassphraseOnServer {
                        server: server.describe(),
                        fingerprint,
                        at,
                        here,
                    })
                }
                ServerCopy::Rewrapped { at, newer: false } => {
                    notify(Notice::OlderPassphraseOnServer {
                        server: server.describe(),
                        fingerprint,
                        at,
                        here,
                    })
                }
                ServerCopy::Opens { newer: true } => {
                    notify(Notice::NewerWrappingOnServer { server: server.describe(), fingerprint })
                }
                ServerCopy::Missing
                | ServerCopy::Same
                | ServerCopy::Opens { newer: false }
                | ServerCopy::Other { .. } => {}
            }
        }
        Ok(Some(Arc::new(keys)))
    }

    /// Writes `file` at the key file's path, owner-only and whole ([`write_private`]), in a
    /// directory made owner-only when missing. Without `replace`, an existing file is refused.
    fn write(&self, file: &KeyFile, replace: bool) -> Result<()> {
        let path = &self.path;
        make_parent(path)?;
        if !replace && path.exists() {
            return Err(ClientError::Invalid(self.exists()));
        }
        write_private(path, file.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::cell::RefCell;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Mutex;
    use std::time::Duration;

    use qsm_types::ServerError;
    use qsm_types::model::{FilespaceId, ObjectId, ObjectVersion, TxnLimits};

    use super::*;
    use crate::server::{ClassInfo, DedupInfo, Fetch, Scope, Upload};

    /// A server that holds the node's key file and does nothing else: all the key policy asks
    /// of one.
    #[derive(Debug, Default)]
    struct KeyServer {
        key: Mutex<Option<Vec<u8>>>,
        puts: Mutex<usize>,
    }

    impl KeyServer {
        fn holding(file: &KeyFile) -> KeyServer {
            KeyServer { key: Mutex::new(Some(file.as_bytes().to_vec())), ..KeyServer::default() }
        }
        fn held(&self) -> Option<Vec<u8>> {
            self.key.lock().unwrap().clone()
        }
        fn puts(&self) -> usize {
            *self.puts.lock().unwrap()
        }
    }

    fn not_keys<T>() -> qsm_types::node::Result<T> {
        Err(ServerError::Failed("not a key operation".into()))
    }

    impl Server for KeyServer {
        fn describe(&self) -> String {
            "the test server".into()
        }
        fn filespaces(&self) -> qsm_types::node::Result<Vec<qsm_types::model::Filespace>> {
            not_keys()
        }
        fn open_filespace(&self, _: &str, _: bool) -> qsm_types::node::Result<Option<FilespaceId>> {
            not_keys()
        }
        fn inventory(
            &self,
            _: FilespaceId,
            _: Scope,
            _: &mut dyn FnMut(ObjectVersion) -> qsm_types::node::Result<()>,
        ) -> qsm_types::node::Result<()> {
            not_keys()
        }
        fn object(&self, _: ObjectId) -> qsm_types::node::Result<Option<ObjectVersion>> {
            not_keys()
        }
        fn upload(
            &self,
            _: FilespaceId,
            _: TxnLimits,
            _: qsm_types::node::UploadKind,
        ) -> qsm_types::node::Result<Box<dyn Upload + '_>> {
            not_keys()
        }
        fn fetch(&self, _: Vec<ObjectId>) -> qsm_types::node::Result<Box<dyn Fetch + '_>> {
            not_keys()
        }
        fn dedup_info(&self) -> qsm_types::node::Result<DedupInfo> {
            not_keys()
        }
        fn have_chunks(&self, _: &[[u8; 32]], _: bool) -> qsm_types::node::Result<Vec<bool>> {
            not_keys()
        }
        fn put_key(&self, key_file: &[u8]) -> qsm_types::node::Result<()> {
            *self.key.lock().unwrap() = Some(key_file.to_vec());
            *self.puts.lock().unwrap() += 1;
            Ok(())
        }
        fn get_key(&self) -> qsm_types::node::Result<Option<Vec<u8>>> {
            Ok(self.held())
        }
        fn mgmt_classes(&self) -> qsm_types::node::Result<Vec<ClassInfo>> {
            not_keys()
        }
        fn schedules(&self, _: bool) -> qsm_types::node::Result<qsm_types::node::Schedules> {
            not_keys()
        }
        fn start_event(&self, _: &str, _: i64) -> qsm_types::node::Result<Option<i64>> {
            not_keys()
        }
        fn end_event(
            &self,
            _: i64,
            _: qsm_types::RunResult,
            _: &str,
        ) -> qsm_types::node::Result<()> {
            not_keys()
        }
        fn client_options(&self) -> qsm_types::node::Result<Option<qsm_types::model::OptionSet>> {
            not_keys()
        }
    }

    /// Passphrases from a table, each question recorded; `None` for a question no one can
    /// answer.
    #[derive(Debug, Default)]
    struct Table {
        key: Option<&'static str>,
        changed: Option<&'static str>,
        old: Option<&'static str>,
        new: Option<&'static str>,
        asked: RefCell<Vec<String>>,
    }

    impl Table {
        fn key(pass: &'static str) -> Table {
            Table { key: Some(pass), ..Table::default() }
        }
        fn asked(&self) -> Vec<String> {
            self.asked.borrow().clone()
        }
    }

    impl Passphrases for Table {
        fn current(&self, asked: Asked) -> Result<Vec<u8>> {
            self.asked.borrow_mut().push(format!("{asked:?}"));
            let given = match asked {
                Asked::Key => self.key,
                Asked::Changed => self.changed,
                Asked::Old => self.old,
            };
            given
                .map(|p| p.as_bytes().to_vec())
                .ok_or_else(|| ClientError::Invalid("no terminal to ask".into()))
        }
        fn new_one(&self, purpose: Purpose) -> Result<Vec<u8>> {
            self.asked.borrow_mut().push(format!("new {purpose:?}"));
            self.new
                .map(|p| p.as_bytes().to_vec())
                .ok_or_else(|| ClientError::Invalid("no terminal to ask".into()))
        }
        fn available(&self) -> bool {
            self.key.is_some()
        }
    }

    /// A keyring at `dir/conf/key` (a directory that does not exist yet), with cheap argon2.
    fn keyring<'a>(dir: &Path, passphrases: &'a Table) -> Keyring<'a> {
        let mut k = Keyring::new(dir.join("conf/key"), passphrases);
        k.kdf = KdfParams::TEST;
        k
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn wrap(key: &MasterKey, pass: &str, secs: u64) -> KeyFile {
        key.wrap_at(pass.as_bytes(), KdfParams::TEST, at(secs)).unwrap()
    }

    fn put(k: &Keyring<'_>, file: &KeyFile) {
        std::fs::create_dir_all(k.path().parent().unwrap()).unwrap();
        std::fs::write(k.path(), file.as_bytes()).unwrap();
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    /// Runs `op` with a notice sink, and returns what it said with its result.
    fn said<T>(op: impl FnOnce(&mut dyn FnMut(Notice)) -> T) -> (T, Vec<Notice>) {
        let mut notices = Vec::new();
        let done = op(&mut |n| notices.push(n));
        (done, notices)
    }

    #[test]
    fn the_first_backup_makes_a_key_and_gives_the_server_a_copy() {
        let dir = tempfile::tempdir().unwrap();
        let table = Table { new: Some("a long passphrase"), ..Table::default() };
        let k = keyring(dir.path(), &table);
        let server = KeyServer::default();
        let (keys, notices) = said(|n| k.node_keys(&server, None, KeyUse::Backup, n));
        let keys = keys.unwrap().unwrap();
        assert_eq!(table.asked(), ["new NewKey"]);
        let written = std::fs::read(k.path()).unwrap();
        assert_eq!(server.held(), Some(written.clone()), "the server holds a copy");
        let file = KeyFile::from_bytes(&written).unwrap();
        let key = file.unwrap_key(b"a long passphrase").unwrap();
        assert_eq!(key.fingerprint(), keys.fingerprint);
        assert_eq!(
            notices,
            [Notice::Made { fingerprint: keys.fingerprint.clone(), path: k.path().into() }]
        );
        // Owner-only, the directory too, and no temporary file left beside it.
        assert_eq!(mode(k.path()), 0o600);
        assert_eq!(mode(k.path().parent().unwrap()), 0o700);
        let names: Vec<_> = std::fs::read_dir(k.path().parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["key"]);
    }

    #[test]
    fn a_short_new_passphrase_is_bad_usage_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let table = Table { new: Some("short"), ..Table::default() };
        let k = keyring(dir.path(), &table);
        let server = KeyServer::default();
        let e = k.node_keys(&server, None, KeyUse::Backup, &mut |_| {}).unwrap_err();
        assert!(matches!(&e, ClientError::Usage(m) if m.contains("shorter than 8")), "{e}");
        assert!(!k.path().exists() && server.held().is_none());
    }

    #[test]
    fn a_new_machine_fetches_the_servers_copy() {
        let key = MasterKey::generate().unwrap();
        let stored = wrap(&key, "the passphrase", 1000);
        for usage in [KeyUse::Backup, KeyUse::Restore { required: false }] {
            let dir = tempfile::tempdir().unwrap();
            let table = Table::key("the passphrase");
            let k = keyring(dir.path(), &table);
            let server = KeyServer::holding(&stored);
            let (keys, notices) = said(|n| k.node_keys(&server, None, usage, n));
            assert_eq!(keys.unwrap().unwrap().fingerprint, key.fingerprint());
            assert_eq!(std::fs::read(k.path()).unwrap(), stored.as_bytes());
            assert_eq!(
                notices,
                [Notice::Fetched { server: "the test server".into(), path: k.path().into() }]
            );
            assert_eq!(server.puts(), 0, "the server already holds this very file");
        }
    }

    #[test]
    fn a_wrong_passphrase_stops_before_anything_is_written() {
        let key = MasterKey::generate().unwrap();
        let stored = wrap(&key, "the passphrase", 1000);
        let dir = tempfile::tempdir().unwrap();
        let table = Table::key("not the passphrase");
        let k = keyring(dir.path(), &table);
        let server = KeyServer::holding(&stored);
        let e = k.node_keys(&server, None, KeyUse::Backup, &mut |_| {}).unwrap_err();
        assert!(e.to_string().starts_with("the key file the test server holds: wrong"), "{e}");
        assert!(!k.path().exists());
        assert_eq!(server.puts(), 0);
    }

    #[test]
    fn a_restore_with_no_one_to_ask_goes_on_without_the_key() {
        let key = MasterKey::generate().unwrap();
        let file = wrap(&key, "the passphrase", 1000);
        let optional = KeyUse::Restore { required: false };
        // A key file here, a copy on the server, or neither: no passphrase asked, none used.
        for (here, held) in [(true, true), (false, true), (false, false)] {
            let dir = tempfile::tempdir().unwrap();
            let table = Table::default();
            let k = keyring(dir.path(), &table);
            if here {
                put(&k, &file);
            }
            let server = if held { KeyServer::holding(&file) } else { KeyServer::default() };
            let (keys, notices) = said(|n| k.node_keys(&server, None, optional, n));
            assert!(keys.unwrap().is_none());
            assert!(table.asked().is_empty() && notices.is_empty());
            assert_eq!(k.path().exists(), here, "nothing is fetched without a passphrase");
        }
        // Nothing anywhere: a passphrase to hand changes nothing.
        let dir = tempfile::tempdir().unwrap();
        let table = Table::key("the passphrase");
        let k = keyring(dir.path(), &table);
        assert!(k.node_keys(&KeyServer::default(), None, optional, &mut |_| {}).unwrap().is_none());
    }

    #[test]
    fn a_restore_that_requires_the_key_and_finds_none_fails() {
        let dir = tempfile::tempdir().unwrap();
        let table = Table::key("the passphrase");
        let k = keyring(dir.path(), &table);
        let e = k
            .node_keys(&KeyServer::default(), None, KeyUse::Restore { required: true }, &mut |_| {})
            .unwrap_err();
        assert!(
            matches!(&e, ClientError::Invalid(m) if m.starts_with("encryption is on, but there is no key at")),
            "{e}"
        );
        assert!(table.asked().is_empty() && !k.path().exists());
    }

    #[test]
    fn a_key_file_that_is_none_and_an_unknown_cipher_are_bad_usage() {
        let dir = tempfile::tempdir().unwrap();
        let table = Table::key("the passphrase");
        let k = keyring(dir.path(), &table);
        assert!(matches!(k.open(), Err(ClientError::Usage(m)) if m.contains("qsm key init")));
        std::fs::create_dir_all(k.path().parent().unwrap()).unwrap();
        std::fs::write(k.path(), b"not a key").unwrap();
        for e in [
            k.open().unwrap_err(),
            k.node_keys(&KeyServer::default(), None, KeyUse::Backup, &mut |_| {}).unwrap_err(),
            k.recovery(true).unwrap_err(),
        ] {
            assert!(matches!(&e, ClientError::Usage(m) if m.contains("not a QSM key file")), "{e}");
        }
        let e = k
            .node_keys(&KeyServer::default(), Some("rot13"), KeyUse::Backup, &mut |_| {})
            .unwrap_err();
        assert!(matches!(&e, ClientError::Usage(m) if m.starts_with("cipher \"rot13\"")), "{e}");
        assert!(table.asked().is_empty());
    }

    #[test]
    fn a_backup_is_told_how_the_servers_copy_stands_and_leaves_a_newer_one() {
        let key = MasterKey::generate().unwrap();
        let fp = key.fingerprint();
        let here = wrap(&key, "the old passphrase", 1000);
        let server_said = |stored: &KeyFile| {
            let dir = tempfile::tempdir().unwrap();
            let table = Table::key("the old passphrase");
            let k = keyring(dir.path(), &table);
            put(&k, &here);
            let server = KeyServer::holding(stored);
            let (keys, notices) = said(|n| k.node_keys(&server, None, KeyUse::Backup, n));
            assert!(keys.unwrap().is_some(), "the backup goes on with the key");
            assert_eq!(server.held().as_deref(), Some(stored.as_bytes()), "left as it is");
            notices
        };
        let server = String::from("the test server");
        assert_eq!(
            server_said(&wrap(&key, "the new passphrase", 2000)),
            [Notice::NewerPassphraseOnServer {
                server: server.clone(),
                fingerprint: fp.clone(),
                at: at(2000),
                here: Some(at(1000))
            }]
        );
        assert_eq!(
            server_said(&wrap(&key, "an older passphrase", 500)),
            [Notice::OlderPassphraseOnServer {
                server: server.clone(),
                fingerprint: fp.clone(),
                at: at(500),
                here: Some(at(1000))
            }]
        );
        assert_eq!(
            server_said(&wrap(&key, "the old passphrase", 2000)),
            [Notice::NewerWrappingOnServer { server, fingerprint: fp }]
        );
    }

    #[test]
    fn init_refuses_a_second_key_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let table = Table { new: Some("a long passphrase"), ..Table::default() };
        let k = keyring(dir.path(), &table);
        let other = wrap(&MasterKey::generate().unwrap(), "theirs", 1000);
        let held = StoredKey { server: "the test server".into(), bytes: other.as_bytes().into() };
        let e = k.init(Some(held.clone()), false, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("already holds a key file for this node"), "{e}");
        assert!(table.asked().is_empty() && !k.path().exists());

        let (done, notices) = said(|n| k.init(Some(held.clone()), true, n));
        done.unwrap();
        let fingerprint = KeyFile::from_bytes(&std::fs::read(k.path()).unwrap())
            .unwrap()
            .unwrap_key(b"a long passphrase")
            .unwrap()
            .fingerprint();
        assert_eq!(
            notices,
            [
                Notice::KeyWritten { path: k.path().into(), fingerprint },
                Notice::OtherKeyStillHeld { server: held.server, stored: held.bytes }
            ]
        );
        // A key set up here is never replaced.
        assert!(k.ensure_absent().is_err());
        let again = k.init(None, true, &mut |_| {}).unwrap_err();
        assert!(again.to_string().contains("exists: a key is already set up here"), "{again}");
    }

    #[test]
    fn a_new_passphrase_rewraps_the_copy_the_old_one_opens() {
        let key = MasterKey::generate().unwrap();
        let old = wrap(&key, "the old passphrase", 1000);
        let table = Table {
            key: Some("the old passphrase"),
            new: Some("the new passphrase"),
            ..Table::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let k = keyring(dir.path(), &table);
        put(&k, &old);
        let server = KeyServer::holding(&old);
        let (done, notices) =
            said(|n| k.change_passphrase(k.open().unwrap(), Some(&server as &dyn Server), n));
        done.unwrap();
        let new = std::fs::read(k.path()).unwrap();
        let file = KeyFile::from_bytes(&new).unwrap();
        assert_eq!(
            file.unwrap_key(b"the new passphrase").unwrap().fingerprint(),
            key.fingerprint()
        );
        assert!(file.unwrap_key(b"the old passphrase").is_err());
        assert!(file.claimed_wrapped_at() > Some(at(1000)));
        assert_eq!(server.held(), Some(new));
        assert_eq!(
            notices,
            [
                Notice::PassphraseChanged { fingerprint: key.fingerprint() },
                Notice::CopyRewrapped { server: "the test server".into() }
            ]
        );

        // A copy the old passphrase does not open is left alone, whatever it claims.
        let dir = tempfile::tempdir().unwrap();
        let k = keyring(dir.path(), &table);
        put(&k, &old);
        let elsewhere = wrap(&key, "set elsewhere", 5000);
        let server = KeyServer::holding(&elsewhere);
        let (done, notices) =
            said(|n| k.change_passphrase(k.open().unwrap(), Some(&server as &dyn Server), n));
        done.unwrap();
        assert_eq!(server.held().as_deref(), Some(elsewhere.as_bytes()));
        assert_eq!(
            notices[1],
            Notice::CopyUnderOtherPassphrase { server: "the test server".into(), at: at(5000) }
        );
        // Stamped after the wrapping it may meet, whatever this machine's clock says.
        let here = KeyFile::from_bytes(&std::fs::read(k.path()).unwrap()).unwrap();
        assert!(here.claimed_wrapped_at() > Some(at(5000)));
    }

    #[test]
    fn a_refresh_takes_the_newer_wrapping_of_this_key_only() {
        let key = MasterKey::generate().unwrap();
        let here = wrap(&key, "the old passphrase", 1000);
        let newer = wrap(&key, "the new passphrase", 2000);
        let table = Table { changed: Some("the new passphrase"), ..Table::default() };
        let refresh = |stored: &KeyFile| {
            let dir = tempfile::tempdir().unwrap();
            let k = keyring(dir.path(), &table);
            put(&k, &here);
            let server = KeyServer::holding(stored);
            let recovery = k.recovery(true).unwrap();
            let (done, notices) = said(|n| k.recover(recovery, &server, n));
            (done, notices, std::fs::read(k.path()).unwrap())
        };
        let (done, notices, now) = refresh(&newer);
        done.unwrap();
        assert_eq!(now, newer.as_bytes());
        assert!(
            matches!(&notices[..], [Notice::Refreshed { fingerprint, at: Some(t), .. }] if *fingerprint == key.fingerprint() && *t == at(2000))
        );
        // Another key under the new passphrase: this machine's would be lost.
        let other = wrap(&MasterKey::generate().unwrap(), "the new passphrase", 3000);
        let (done, _, now) = refresh(&other);
        assert!(done.unwrap_err().to_string().contains("not this machine's key"));
        assert_eq!(now, here.as_bytes());
        // An older wrapping: the passphrase it replaced would open the key again.
        let older = wrap(&key, "the new passphrase", 10);
        let (done, _, now) = refresh(&older);
        assert!(done.unwrap_err().to_string().contains("go back to an older wrapping"));
        assert_eq!(now, here.as_bytes());
        // Without --refresh, an existing key file is never replaced.
        let dir = tempfile::tempdir().unwrap();
        let k = keyring(dir.path(), &table);
        put(&k, &here);
        assert!(k.recovery(false).unwrap_err().to_string().contains("--refresh"));
    }

    #[test]
    fn an_upload_never_puts_an_older_wrapping_back() {
        let key = MasterKey::generate().unwrap();
        let here = wrap(&key, "the old passphrase", 1000);
        let table = Table::key("the old passphrase");
        let dir = tempfile::tempdir().unwrap();
        let k = keyring(dir.path(), &table);
        put(&k, &here);
        let newer = wrap(&key, "the new passphrase", 2000);
        let server = KeyServer::holding(&newer);
        for replace in [false, true] {
            let e = k.upload(k.open().unwrap(), &server, replace, &mut |_| {}).unwrap_err();
            assert!(e.to_string().contains("even --replace does not put it"), "{e}");
        }
        assert_eq!(server.held().as_deref(), Some(newer.as_bytes()));
        // Another key only with --replace; then this machine's file is there.
        let other = wrap(&MasterKey::generate().unwrap(), "theirs", 3000);
        let server = KeyServer::holding(&other);
        let e = k.upload(k.open().unwrap(), &server, false, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("--replace to overwrite it"), "{e}");
        let (done, notices) = said(|n| k.upload(k.open().unwrap(), &server, true, n));
        done.unwrap();
        assert_eq!(server.held().as_deref(), Some(here.as_bytes()));
        assert_eq!(
            notices,
            [Notice::Stored { server: "the test server".into(), fingerprint: key.fingerprint() }]
        );
    }

    #[test]
    fn the_key_file_is_the_flag_then_the_environment_then_home() {
        let p = |given: Option<&str>, env: Option<&str>, home: Option<&str>| {
            key_path_from(given.map(PathBuf::from), env.map(Into::into), home.map(Into::into))
        };
        assert_eq!(p(Some("/f"), Some("/e"), Some("/h")).unwrap(), Path::new("/f"));
        assert_eq!(p(None, Some("/e"), Some("/h")).unwrap(), Path::new("/e"));
        assert_eq!(p(None, None, Some("/h")).unwrap(), Path::new("/h/.config/qsm/key"));
        assert!(p(None, None, None).is_err());
    }
}
