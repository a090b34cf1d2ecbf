//! Where client commands send their data: a QSM server (flags, environment, or the client
//! configuration file), or, with none configured, the embedded store in `$QSM_HOME`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use qsm_client::remote::{RemoteOptions, RemoteServer};
use qsm_client::server::Server;
use qsm_server::{Embedded, embedded};
use serde::Deserialize;

/// The client configuration file (`~/.config/qsm/client.toml`, or `--config`). Flags and
/// environment variables override it.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// `https://HOST:PORT`, `http://HOST:PORT` or `unix:PATH`.
    pub server: Option<String>,
    /// This machine's node name.
    pub node: Option<String>,
    /// A file holding the node's password (first line).
    pub password_file: Option<PathBuf>,
    /// The server certificate to trust.
    pub ca: Option<PathBuf>,
    /// Default compression (`auto`, `off`, `CODEC[:LEVEL]`).
    pub compression: Option<String>,
    /// Default upload limit (e.g. `10Mbit`).
    pub limit_upload: Option<String>,
    /// Transaction limits asked of the server.
    pub txn_group_max: Option<usize>,
    pub txn_byte_limit: Option<u64>,
    /// Worker threads.
    pub threads: Option<usize>,
    /// Include and exclude patterns for every backup and archive (see `qsm backup --help`);
    /// those given as flags are added to these.
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    /// Management-class bindings, `PATTERN=CLASS` (`qsm backup --mgmtclass`).
    pub mgmtclass: Vec<String>,
    /// Deduplicate backups (`qsm backup --dedup`).
    pub dedup: Option<bool>,
    /// Encrypt backups with the node's key (`qsm backup --encryption`).
    pub encryption: Option<bool>,
    /// The AEAD new frames are sealed with: `aes-256-gcm` (default) or `chacha20-poly1305`.
    pub cipher: Option<String>,
    /// The node's key file (default: $QSM_KEY_FILE, or ~/.config/qsm/key).
    pub key_file: Option<PathBuf>,
    /// Restores refuse files that were not encrypted (`qsm restore --require-encryption`).
    pub require_encryption: Option<bool>,
    /// The change journal backups use when it is valid (default: ~/.local/state/qsm/journal.db
    /// if it exists).
    pub journal: Option<PathBuf>,
    /// How many times a file that changed while read is read again (`qsm backup
    /// --changing-retries`).
    pub changing_retries: Option<u32>,
}

/// How to reach the data: every client command takes these.
#[derive(Debug, Args, Clone)]
pub struct Conn {
    /// The embedded store's directory, used when no server is configured (default:
    /// $QSM_HOME, or ~/.local/share/qsm).
    #[arg(long, global = true)]
    home: Option<PathBuf>,
    /// A QSM server: https://HOST:PORT, http://HOST:PORT (no TLS) or unix:PATH. Several,
    /// comma-separated, for servers sharing one catalog and pool: the first that answers is
    /// used, and a backup whose server dies resumes on another.
    #[arg(long, global = true, env = "QSM_SERVER")]
    server: Option<String>,
    /// This machine's node name on the server.
    #[arg(long, global = true, env = "QSM_NODE")]
    node: Option<String>,
    /// A file whose first line is the node's password.
    #[arg(long, global = true, env = "QSM_PASSWORD_FILE")]
    password_file: Option<PathBuf>,
    /// The server certificate to trust (a self-signed server's DATA_DIR/tls/cert.pem).
    #[arg(long, global = true, env = "QSM_CA")]
    ca: Option<PathBuf>,
    /// The client configuration file (default: ~/.config/qsm/client.toml if it exists).
    #[arg(long, global = true, env = "QSM_CONFIG")]
    config: Option<PathBuf>,
    /// Allow http:// (no TLS) to a server that is not on this machine: the password and
    /// every file then cross the network in clear.
    #[arg(long, global = true, env = "QSM_INSECURE")]
    insecure: bool,
}

/// An open connection of either kind.
#[derive(Debug)]
pub enum Connected {
    Embedded(Embedded),
    Remote(RemoteServer),
}

impl Connected {
    /// The server interface.
    pub fn server(&self) -> Box<dyn Server + '_> {
        match self {
            Connected::Embedded(e) => Box::new(e.server()),
            Connected::Remote(r) => Box::new(r),
        }
    }

    /// Where the dedup cache for this server and node is kept: in the embedded store's
    /// directory, or under `$XDG_CACHE_HOME/qsm` (`~/.cache/qsm`) for a server.
    pub fn dedup_cache(&self, conn: &Conn) -> Option<PathBuf> {
        match self {
            Connected::Embedded(_) => {
                let home = conn.home.clone().or_else(|| embedded::default_home().ok())?;
                Some(home.join("dedup.cache"))
            }
            Connected::Remote(r) => {
                let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache"))
                })?;
                let name: String = r
                    .describe()
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' })
                    .collect();
                Some(base.join("qsm").join(format!("dedup-{name}.cache")))
            }
        }
    }
}

/// Refuses a secret's file (`what`: "password file") that others could read or change.
pub fn check_owner_only(path: &Path, what: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| crate::usage::usage(format!("the {what} {}: {e}", path.display())))?;
    if meta.mode() & 0o077 != 0 {
        return Err(crate::usage::usage(format!(
            "the {what} {} is readable by others: chmod 600 it",
            path.display()
        )));
    }
    Ok(())
}

/// The first line of a password file, which must not be readable by others.
pub fn read_password(path: &Path) -> Result<String> {
    check_owner_only(path, "password file")?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| crate::usage::usage(format!("the password file {}: {e}", path.display())))?;
    let password = text.lines().next().unwrap_or_default();
    if password.is_empty() {
        return Err(crate::usage::usage(format!(
            "the password file {} is empty: its first line is the password",
            path.display()
        )));
    }
    Ok(password.to_owned())
}

/// A new password from the first line of stdin, which must not be empty.
pub fn password_from_stdin() -> Result<String> {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).context("reading the password from stdin")?;
    let password = line.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err(crate::usage::usage(
            "no password on stdin: its first line is the password (or give --new-password-file)",
        ));
    }
    Ok(password.to_owned())
}

impl Conn {
    /// The client configuration: the named file, or the default one if it exists.
    pub fn config(&self) -> Result<ClientConfig> {
        let path = match &self.config {
            Some(p) => p.clone(),
            None => match std::env::var_os("HOME") {
                Some(h) => PathBuf::from(h).join(".config/qsm/client.toml"),
                None => return Ok(ClientConfig::default()),
            },
        };
        if self.config.is_none() && !path.exists() {
            return Ok(ClientConfig::default());
        }
        // A configuration that cannot be read, or is not one, is bad usage: before any work.
        let bad = |why: String| {
            crate::usage::usage(format!("the client configuration {}: {why}", path.display()))
        };
        let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
        toml::from_str(&text).map_err(|e| bad(e.to_string()))
    }

    /// Whether there is somewhere data is kept: a configured server, or an embedded store that
    /// exists (so commands that only update what a store holds do not create one).
    pub fn has_store(&self) -> Result<bool> {
        if self.server.is_some() || self.config()?.server.is_some() {
            return Ok(true);
        }
        let home = match &self.home {
            Some(h) => h.clone(),
            None => embedded::default_home()?,
        };
        Ok(home.join("catalog.db").exists())
    }

    /// Connects to the configured server, or opens the embedded store.
    pub fn open(&self) -> Result<Connected> {
        self.open_from(&mut 0)
    }

    /// The configured server addresses (none: the embedded store).
    pub fn servers(&self) -> Result<Vec<String>> {
        let list = self.server.clone().or(self.config()?.server).unwrap_or_default();
        Ok(list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect())
    }

    /// Connects to the first configured server that answers, trying them in order from the
    /// `start`th (cyclically), which is left naming the one connected to.
    pub fn open_from(&self, start: &mut usize) -> Result<Connected> {
        let config = self.config()?;
        let servers = self.servers()?;
        if servers.is_empty() {
            let home = match &self.home {
                Some(h) => h.clone(),
                None => embedded::default_home()?,
            };
            let e = Embedded::open(&home)
                .with_context(|| format!("opening the QSM store in {}", home.display()))?;
            for warning in e.warnings() {
                errln!("qsm: warning: {warning}");
            }
            return Ok(Connected::Embedded(e));
        }
        let account = self.node.clone().or(config.node).ok_or_else(|| {
            crate::usage::usage("a server is configured but no node name: give --node or QSM_NODE")
        })?;
        let password_file = self.password_file.clone().or(config.password_file).ok_or_else(|| {
            crate::usage::usage(
                "a server is configured but no password: give --password-file or QSM_PASSWORD_FILE",
            )
        })?;
        let mut options = RemoteOptions {
            url: String::new(),
            account,
            password: read_password(&password_file)?,
            admin: false,
            ca: self.ca.clone().or(config.ca),
            insecure: self.insecure,
        };
        let mut last = None;
        for k in 0..servers.len() {
            let i = (*start + k) % servers.len();
            options.url = servers[i].clone();
            match RemoteServer::connect(&options) {
                Ok(r) => {
                    *start = i;
                    return Ok(Connected::Remote(r));
                }
                // Another address may answer; a refused login or a bad address would be
                // refused by every server alike.
                Err(
                    e @ qsm_client::ClientError::Server(qsm_types::ServerError::Unreachable(_)),
                ) if servers.len() > 1 => last = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.map_or_else(|| anyhow::anyhow!("no server configured"), anyhow::Error::from))
    }
}

/// A rate such as `10Mbit`, `1Gbit`, `500kbit` (bits per second) or `5MB`, `100KiB` (bytes
/// per second), in bytes per second.
pub fn parse_rate(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{text:?}: expected e.g. 10Mbit or 5MB"))?;
    let per_second = match unit.trim().trim_end_matches("/s").trim_end_matches("ps") {
        "bit" | "b" => n / 8.0,
        "kbit" | "Kbit" => n * 1e3 / 8.0,
        "Mbit" | "mbit" => n * 1e6 / 8.0,
        "Gbit" | "gbit" => n * 1e9 / 8.0,
        "" | "B" => n,
        "kB" | "KB" => n * 1e3,
        "MB" => n * 1e6,
        "GB" => n * 1e9,
        "KiB" => n * 1024.0,
        "MiB" => n * 1024.0 * 1024.0,
        "GiB" => n * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use bit, kbit, Mbit, Gbit, B, kB, MB, GB, KiB, MiB, GiB)"
            ));
        }
    };
    if per_second < 1.0 {
        return Err(format!("{text:?}: at least 1 byte per second"));
    }
    Ok(per_second as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rates_in_bits_and_bytes() {
        assert_eq!(parse_rate("10Mbit"), Ok(1_250_000));
        assert_eq!(parse_rate("1Gbit/s"), Ok(125_000_000));
        assert_eq!(parse_rate("5MB"), Ok(5_000_000));
        assert_eq!(parse_rate("1MiB"), Ok(1_048_576));
        assert_eq!(parse_rate("800"), Ok(800));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("10 parsecs").is_err());
        assert!(parse_rate("0").is_err());
    }
}
