//! Where a client's settings come from and where its data goes: flags win over the client
//! configuration file (`~/.config/qsm/client.toml`), which wins over the defaults; with no
//! server configured, data goes to the embedded store in the home directory, which the binary
//! opens (this crate knows no store). Servers sharing one catalog and pool are tried in turn.
//!
//! Every refusal here is [`ClientError::Usage`]: a setting that cannot work, or a file named
//! that is not what it should be, found before any work is done.

use std::path::{Path, PathBuf};

use qsm_codec::Compression;
use qsm_types::{ServerError, TxnLimits};
use serde::Deserialize;

use crate::adaptive::Objective;
use crate::backup::{BackupOptions, MAX_CHANGING_RETRIES};
use crate::filter::{Bindings, Filter};

use crate::error::{ClientError, Result};
use crate::remote::{RemoteOptions, RemoteServer};
use crate::server::Server;

/// The client configuration file. Flags and environment variables override it.
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
    /// `qsm sched` runs this (`sh -c`) before each scheduled action; if it fails, the event
    /// fails and the action is skipped (TSM's PRESCHEDULECMD).
    pub pre_command: Option<String>,
    /// `qsm sched` runs this after each scheduled action, whatever its outcome (in
    /// `$QSM_EVENT_STATE`); if it fails, a completed event is completed with warnings.
    pub post_command: Option<String>,
}

impl ClientConfig {
    /// The file `path`, or without one the default file if it exists (else the defaults).
    pub fn load(path: Option<&Path>) -> Result<ClientConfig> {
        if let Some(p) = path {
            return ClientConfig::load_named(p);
        }
        match std::env::var_os("HOME") {
            Some(h) => {
                let default = PathBuf::from(h).join(".config/qsm/client.toml");
                if default.exists() {
                    ClientConfig::load_named(&default)
                } else {
                    Ok(ClientConfig::default())
                }
            }
            None => Ok(ClientConfig::default()),
        }
    }
}

/// What a server's client option set gives a node (issue 26, TSM's client option sets). The
/// precedence, highest first: forced server options, flags, client.toml, the server's other
/// options, the defaults. Include and exclude patterns are not overridden but added, forced or
/// not, to the node's own (as TSM adds a set's INCLEXCL statements).
#[derive(Debug, Default)]
pub struct ServerOptions {
    /// The option set's name (`None`: the node uses none).
    pub set: Option<String>,
    forced: ClientConfig,
    unforced: ClientConfig,
    forced_names: Vec<String>,
    /// Each option that took effect, as `name=value`, with ` (forced)` when it is: an
    /// unforced one the node's client.toml or a flag gives is left out
    /// ([`ServerOptions::apply`], [`ServerOptions::flags_given`]).
    pub given: Vec<String>,
    /// (name, entry of `given`) of the unforced single-valued options.
    unforced_given: Vec<(String, String)>,
}

impl ServerOptions {
    /// What `set` gives; a value the client cannot use is refused, naming the set (an option
    /// unknown to this client too: a forced `encryption` must not be dropped silently).
    pub fn new(set: Option<&qsm_types::model::OptionSet>) -> Result<ServerOptions> {
        let Some(set) = set else { return Ok(ServerOptions::default()) };
        let mut out = ServerOptions { set: Some(set.name.clone()), ..ServerOptions::default() };
        for o in &set.options {
            let bad = |why: String| {
                ClientError::Usage(format!("the server's client option set {}: {why}", set.name))
            };
            qsm_types::clientopts::check(&o.name, &o.value).map_err(bad)?;
            // A server may require encryption, never forbid it: the node's own `encryption`
            // on is what keeps its data from the server (an older or hostile server could
            // send a forced off, which then only fills in).
            let weakens =
                o.name == "encryption" && qsm_types::clientopts::switch(&o.value) == Some(false);
            let force = o.force && !weakens;
            let layer = if force { &mut out.forced } else { &mut out.unforced };
            let number = |what: &str| -> Result<u64> {
                o.value.parse().map_err(|_| bad(format!("{what} {:?}: not a number", o.value)))
            };
            let switch = || qsm_types::clientopts::switch(&o.value);
            match o.name.as_str() {
                "include" => layer.include.push(o.value.clone()),
                "exclude" => layer.exclude.push(o.value.clone()),
                "compression" => layer.compression = Some(o.value.clone()),
                "dedup" => layer.dedup = switch(),
                "encryption" => layer.encryption = switch(),
                "limit_upload" => layer.limit_upload = Some(o.value.clone()),
                "txn_group_max" => layer.txn_group_max = Some(number(&o.name)? as usize),
                "txn_byte_limit" => layer.txn_byte_limit = Some(number(&o.name)?),
                "threads" => layer.threads = Some(number(&o.name)? as usize),
                other => return Err(bad(format!("option {other} is not known to this client"))),
            }
            if force {
                out.forced_names.push(o.name.clone());
            }
            let said = if force { " (forced)" } else { "" };
            let entry = format!("{}={}{said}", o.name, o.value);
            let pattern = o.name == "include" || o.name == "exclude";
            if !force && !pattern {
                out.unforced_given.push((o.name.clone(), entry.clone()));
            }
            out.given.push(entry);
        }
        Ok(out)
    }

    /// Whether the set forces option `name` (a flag giving it is then overridden).
    pub fn forces(&self, name: &str) -> bool {
        self.forced_names.iter().any(|n| n == name)
    }

    /// Leaves out of [`ServerOptions::given`] the unforced options named, which the node's
    /// own flags gave.
    pub fn flags_given(&mut self, names: &[&str]) {
        for name in names {
            self.drop_given(name);
        }
    }

    fn drop_given(&mut self, name: &str) {
        let entries: Vec<String> =
            self.unforced_given.iter().filter(|(n, _)| n == name).map(|(_, e)| e.clone()).collect();
        self.given.retain(|g| !entries.contains(g));
    }

    /// `file` (the client configuration) with the set's options in their places: forced ones
    /// over it, others under it (and out of [`ServerOptions::given`] where `file` sets them).
    pub fn apply(&mut self, file: ClientConfig) -> ClientConfig {
        let set_in_file: Vec<&str> = [
            ("compression", file.compression.is_some()),
            ("dedup", file.dedup.is_some()),
            ("encryption", file.encryption.is_some()),
            ("limit_upload", file.limit_upload.is_some()),
            ("txn_group_max", file.txn_group_max.is_some()),
            ("txn_byte_limit", file.txn_byte_limit.is_some()),
            ("threads", file.threads.is_some()),
        ]
        .into_iter()
        .filter_map(|(n, set)| set.then_some(n))
        .collect();
        self.flags_given(&set_in_file);
        let mut c = file;
        let (f, u) = (&self.forced, &self.unforced);
        macro_rules! layer {
            ($($field:ident),*) => {$(
                if c.$field.is_none() {
                    c.$field = u.$field.clone();
                }
                if f.$field.is_some() {
                    c.$field = f.$field.clone();
                }
            )*};
        }
        layer!(
            compression,
            dedup,
            encryption,
            limit_upload,
            txn_group_max,
            txn_byte_limit,
            threads
        );
        let mut include = [u.include.clone(), f.include.clone()].concat();
        include.append(&mut c.include);
        c.include = include;
        let mut exclude = [u.exclude.clone(), f.exclude.clone()].concat();
        exclude.append(&mut c.exclude);
        c.exclude = exclude;
        c
    }
}

/// What a backup's or archive's flags say, before the configuration fills in the rest.
#[derive(Debug, Clone, Default)]
pub struct Given<'a> {
    /// `--compression`.
    pub compression: Option<&'a str>,
    /// `-T`.
    pub threads: Option<usize>,
    /// `--include`, `--exclude` and `--mgmtclass`: added to the configuration's.
    pub include: &'a [String],
    pub exclude: &'a [String],
    pub mgmtclass: &'a [String],
}

impl ClientConfig {
    /// The backup options from `given` flags, then this configuration, then the defaults. A
    /// value the configuration gives is checked as its flag is, and named as the
    /// configuration's.
    pub fn backup_options(&self, given: &Given<'_>) -> Result<BackupOptions> {
        let mut options = BackupOptions::default();
        let (compression, from) = match (given.compression, self.compression.as_deref()) {
            (Some(c), _) => (c, "--compression"),
            (None, Some(c)) => (c, "compression in the client configuration"),
            (None, None) => ("auto", "--compression"),
        };
        // `auto`, `auto:fast` and `auto:small` adapt per quantum; `auto:LEVEL` or a codec is a
        // fixed setting.
        options.adaptive = Objective::parse(compression);
        options.compression = match options.adaptive {
            Some(_) => Compression::AUTO,
            None => Compression::parse(compression).map_err(|e| {
                let objective = compression.trim().to_ascii_lowercase().starts_with("auto:");
                let hint =
                    if objective { " (auto, auto:fast, auto:small or auto:LEVEL)" } else { "" };
                ClientError::Usage(format!("{from} {compression:?}: {e}{hint}"))
            })?,
        };
        options.threads = given.threads.or(self.threads);
        let configured = |name: &'static str| {
            move |why: String| {
                ClientError::Usage(format!("{name} in the client configuration: {why}"))
            }
        };
        if let Some(n) = self.changing_retries {
            options.changing_retries = within(n, 0, MAX_CHANGING_RETRIES, "retries")
                .map_err(configured("changing_retries"))?;
        }
        if let Some(rate) = &self.limit_upload {
            options.limit_upload = Some(parse_rate(rate).map_err(configured("limit_upload"))?);
        }
        if let Some(n) = self.txn_group_max {
            options.limits.group_max = within(n, 1, TxnLimits::MAX_GROUP, "objects")
                .map_err(configured("txn_group_max"))?;
        }
        if let Some(n) = self.txn_byte_limit {
            options.limits.byte_limit = within(n, 1, TxnLimits::MAX_BYTES, "bytes")
                .map_err(configured("txn_byte_limit"))?;
        }
        let joined =
            |a: &[String], b: &[String]| -> Vec<String> { a.iter().chain(b).cloned().collect() };
        let include = joined(&self.include, given.include);
        let exclude = joined(&self.exclude, given.exclude);
        options.filter = Filter::new(&include, &exclude)?;
        options.bindings = Bindings::new(&joined(&self.mgmtclass, given.mgmtclass))?;
        Ok(options)
    }
}

/// `value` when it is from `min` to `max` (`unit`, for the message); else why not, with the
/// limits and the unit. The one range check of option values and configuration settings.
pub fn within<T: PartialOrd + std::fmt::Display>(
    value: T,
    min: T,
    max: T,
    unit: &str,
) -> std::result::Result<T, String> {
    // Written so that NaN is refused too.
    if value >= min && value <= max {
        Ok(value)
    } else {
        Err(format!("{value} is outside {min} to {max} {unit}"))
    }
}

/// How to reach the data, as the flags (or their environment variables) give it.
#[derive(Debug, Clone, Default)]
pub struct Reach {
    /// The embedded store's directory (default: $QSM_HOME, or ~/.local/share/qsm).
    pub home: Option<PathBuf>,
    /// Comma-separated server addresses.
    pub server: Option<String>,
    pub node: Option<String>,
    pub password_file: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    /// The client configuration file, when named.
    pub config: Option<PathBuf>,
    /// Allow `http://` to a server not on this machine.
    pub insecure: bool,
}

impl Reach {
    /// The client configuration: the named file, or the default one if it exists.
    pub fn config(&self) -> Result<ClientConfig> {
        ClientConfig::load(self.config.as_deref())
    }

    /// The configured server addresses (none: the embedded store).
    pub fn servers(&self) -> Result<Vec<String>> {
        let list = self.server.clone().or(self.config()?.server).unwrap_or_default();
        Ok(list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect())
    }

    /// Connects to the first of `servers` that answers, trying them in order from the
    /// `start`th (cyclically), which is left naming the one connected to.
    pub fn connect(&self, servers: &[String], start: &mut usize) -> Result<RemoteServer> {
        let config = self.config()?;
        let account = self.node.clone().or(config.node).ok_or_else(|| {
            ClientError::Usage(
                "a server is configured but no node name: give --node or QSM_NODE".into(),
            )
        })?;
        let password_file =
            self.password_file.clone().or(config.password_file).ok_or_else(|| {
                ClientError::Usage(
                "a server is configured but no password: give --password-file or QSM_PASSWORD_FILE"
                    .into(),
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
                    return Ok(r);
                }
                // Another address may answer; a refused login or a bad address would be
                // refused by every server alike.
                Err(e @ ClientError::Server(ServerError::Unreachable(_))) if servers.len() > 1 => {
                    last = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Usage("no server configured".into())))
    }
}

impl ClientConfig {
    /// The file `path`: missing, unreadable or not a configuration is bad usage.
    fn load_named(path: &Path) -> Result<ClientConfig> {
        let bad = |why: String| {
            ClientError::Usage(format!("the client configuration {}: {why}", path.display()))
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        toml::from_str(&text).map_err(|e| bad(e.to_string()))
    }
}

/// Where the dedup cache for `server` and its node is kept: under `$XDG_CACHE_HOME/qsm`
/// (`~/.cache/qsm`), one file per server address and account.
pub fn dedup_cache(server: &RemoteServer) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let name: String = server
        .describe()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' })
        .collect();
    Some(base.join("qsm").join(format!("dedup-{name}.cache")))
}

/// Refuses a secret's file (`what`: "password file") that others could read or change.
pub fn check_owner_only(path: &Path, what: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| ClientError::Usage(format!("the {what} {}: {e}", path.display())))?;
    if meta.mode() & 0o077 != 0 {
        return Err(ClientError::Usage(format!(
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
        .map_err(|e| ClientError::Usage(format!("the password file {}: {e}", path.display())))?;
    let password = text.lines().next().unwrap_or_default();
    if password.is_empty() {
        return Err(ClientError::Usage(format!(
            "the password file {} is empty: its first line is the password",
            path.display()
        )));
    }
    Ok(password.to_owned())
}

pub use qsm_types::clientopts::parse_rate;

/// Where the client keeps its state (the change journal, the scheduler's lock):
/// `$XDG_STATE_HOME/qsm`, or `~/.local/state/qsm`.
pub fn state_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(base.join("qsm"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_server_options_win_and_others_fill_in() {
        let opt = |name: &str, value: &str, force: bool| qsm_types::model::ClientOpt {
            name: name.into(),
            value: value.into(),
            force,
        };
        let set = qsm_types::model::OptionSet {
            name: "servers".into(),
            description: String::new(),
            options: vec![
                opt("compression", "zstd:9", true),
                opt("threads", "3", false),
                opt("limit_upload", "10Mbit", false),
                opt("exclude", "*.tmp", true),
                opt("dedup", "on", false),
            ],
        };
        let mut given = ServerOptions::new(Some(&set)).unwrap();
        let file = ClientConfig {
            compression: Some("lz4".into()),
            limit_upload: Some("1Gbit".into()),
            exclude: vec!["*.o".into()],
            ..ClientConfig::default()
        };
        let c = given.apply(file);
        assert_eq!(c.compression.as_deref(), Some("zstd:9"), "forced over the file");
        assert_eq!(c.limit_upload.as_deref(), Some("1Gbit"), "the file over the unforced");
        assert_eq!(c.threads, Some(3), "the unforced fills in");
        assert_eq!(c.dedup, Some(true));
        assert_eq!(c.exclude, ["*.tmp", "*.o"], "patterns add up");
        assert!(given.forces("compression") && !given.forces("threads"));
        assert_eq!(given.given[0], "compression=zstd:9 (forced)");
        assert!(!given.given.iter().any(|g| g.starts_with("limit_upload")), "the file's won");
        given.flags_given(&["threads"]);
        assert_eq!(
            given.given,
            ["compression=zstd:9 (forced)", "exclude=*.tmp (forced)", "dedup=on"]
        );
        let bad = qsm_types::model::OptionSet {
            options: vec![opt("threads", "lots", true)],
            ..set.clone()
        };
        let e = ServerOptions::new(Some(&bad)).unwrap_err().to_string();
        assert!(e.contains("servers") && e.contains("threads"), "{e}");
        assert!(ServerOptions::new(None).unwrap().set.is_none());
        // Encryption can be forced on, never off.
        let off = qsm_types::model::OptionSet {
            options: vec![opt("encryption", "off", true)],
            ..set.clone()
        };
        let mut off = ServerOptions::new(Some(&off)).unwrap();
        assert!(!off.forces("encryption"));
        let mine = ClientConfig { encryption: Some(true), ..ClientConfig::default() };
        assert_eq!(off.apply(mine).encryption, Some(true), "the node's encryption stands");
        let on = qsm_types::model::OptionSet {
            options: vec![opt("encryption", "on", true)],
            ..set.clone()
        };
        let mine = ClientConfig { encryption: Some(false), ..ClientConfig::default() };
        let mut on = ServerOptions::new(Some(&on)).unwrap();
        assert_eq!(on.apply(mine).encryption, Some(true));
    }

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

    #[test]
    fn flags_win_over_the_configuration_and_servers_split_on_commas() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.toml");
        std::fs::write(&file, "server = \"unix:/a, unix:/b\"\nnode = \"n\"\n").unwrap();
        let reach = Reach { config: Some(file.clone()), ..Reach::default() };
        assert_eq!(reach.servers().unwrap(), ["unix:/a", "unix:/b"]);
        let reach = Reach { server: Some("unix:/c".into()), ..reach };
        assert_eq!(reach.servers().unwrap(), ["unix:/c"]);
        std::fs::write(&file, "servr = \"x\"\n").unwrap();
        let e = reach.config().unwrap_err();
        assert!(matches!(&e, ClientError::Usage(m) if m.contains("client.toml")), "{e}");
    }

    #[test]
    fn compression_objectives_and_fixed_settings() {
        let config = ClientConfig::default();
        let options =
            |c: &str| config.backup_options(&Given { compression: Some(c), ..Given::default() });
        assert_eq!(options("auto").unwrap().adaptive, Some(Objective::Balanced));
        assert_eq!(options("auto:fast").unwrap().adaptive, Some(Objective::Fast));
        assert_eq!(options("auto:small").unwrap().adaptive, Some(Objective::Small));
        let fixed = options("auto:9").unwrap();
        assert_eq!((fixed.adaptive, fixed.compression.setting()), (None, "zstd:9".to_owned()));
        assert_eq!(
            config.backup_options(&Given::default()).unwrap().adaptive,
            Some(Objective::Balanced)
        );
        let e = options("auto:quick").unwrap_err();
        assert!(
            matches!(&e, ClientError::Usage(m) if m.contains("auto:quick") && m.contains("auto:small")),
            "{e}"
        );
    }

    #[test]
    fn a_missing_named_configuration_is_bad_usage() {
        let reach = Reach { config: Some("/nonexistent/client.toml".into()), ..Reach::default() };
        assert!(matches!(reach.config(), Err(ClientError::Usage(_))));
    }

    #[test]
    fn a_password_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "secret\nignored\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            matches!(read_password(&file), Err(ClientError::Usage(m)) if m.contains("chmod 600"))
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_password(&file).unwrap(), "secret");
    }
}
