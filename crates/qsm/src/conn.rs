//! Where client commands send their data: a QSM server (flags, environment, or the client
//! configuration file), or, with none configured, the embedded store in `$QSM_HOME`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use qsm_client::config::Reach;
use qsm_client::remote::RemoteServer;
use qsm_client::server::Server;
use qsm_server::{Embedded, embedded};

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
            Connected::Remote(r) => qsm_client::config::dedup_cache(r),
        }
    }
}

pub use qsm_client::config::{ClientConfig, check_owner_only, parse_rate, read_password};

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
    /// The flags that take another `qsm` to the same place (the scheduler's children), as
    /// given: what came from the environment reaches the child through its environment.
    pub fn args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        let mut flag = |name: &str, value: Option<std::ffi::OsString>| {
            if let Some(v) = value {
                args.push(name.into());
                args.push(v);
            }
        };
        flag("--home", self.home.clone().map(Into::into));
        flag("--server", self.server.clone().map(Into::into));
        flag("--node", self.node.clone().map(Into::into));
        flag("--password-file", self.password_file.clone().map(Into::into));
        flag("--ca", self.ca.clone().map(Into::into));
        flag("--config", self.config.clone().map(Into::into));
        if self.insecure {
            args.push("--insecure".into());
        }
        args
    }

    /// The flags as the library takes them.
    pub(crate) fn reach(&self) -> Reach {
        Reach {
            home: self.home.clone(),
            server: self.server.clone(),
            node: self.node.clone(),
            password_file: self.password_file.clone(),
            ca: self.ca.clone(),
            config: self.config.clone(),
            insecure: self.insecure,
        }
    }

    /// The client configuration: the named file, or the default one if it exists.
    pub fn config(&self) -> Result<ClientConfig> {
        Ok(self.reach().config()?)
    }

    /// The embedded store's directory.
    fn home(&self) -> Result<PathBuf> {
        match &self.home {
            Some(h) => Ok(h.clone()),
            None => Ok(embedded::default_home()?),
        }
    }

    /// Whether there is somewhere data is kept: a configured server, or an embedded store that
    /// exists (so commands that only update what a store holds do not create one).
    pub fn has_store(&self) -> Result<bool> {
        Ok(!self.servers()?.is_empty() || self.home()?.join("catalog.db").exists())
    }

    /// Connects to the configured server, or opens the embedded store.
    pub fn open(&self) -> Result<Connected> {
        self.open_from(&mut 0)
    }

    /// The configured server addresses (none: the embedded store).
    pub fn servers(&self) -> Result<Vec<String>> {
        Ok(self.reach().servers()?)
    }

    /// Connects to the first configured server that answers, trying them in order from the
    /// `start`th (cyclically), which is left naming the one connected to; with none
    /// configured, opens the embedded store.
    pub fn open_from(&self, start: &mut usize) -> Result<Connected> {
        let reach = self.reach();
        let servers = reach.servers()?;
        if !servers.is_empty() {
            return Ok(Connected::Remote(reach.connect(&servers, start)?));
        }
        let home = self.home()?;
        let e = Embedded::open(&home)
            .with_context(|| format!("opening the QSM store in {}", home.display()))?;
        for warning in e.warnings() {
            errln!("qsm: warning: {warning}");
        }
        Ok(Connected::Embedded(e))
    }
}
