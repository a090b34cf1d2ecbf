//! `qsm server` and `qsm admin`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use qsm_client::remote::{self, RemoteOptions, RemoteServer};
use qsm_proto::AdminApi;
use qsm_proto::v1;
use qsm_server::Embedded;
use qsm_server::ServerConfig;
use qsm_server::admin::{MAX_ACTLOG_ENTRIES, MAX_EXPIRE_WORKERS};
use qsm_types::TxnLimits;

use crate::conn::{password_from_stdin, read_password};

/// `qsm server`: the settings an operator changes at start are also flags, which win; the
/// limits and the shared-catalog lease (`idle_timeout_minutes`, `max_node_sessions`,
/// `max_streams`, `max_node_streams`, `tls_names`, `lease_seconds`, `[s3]`) are set
/// in the configuration file only (docs/ADMIN.md).
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// What to do with the server's files while it is stopped (default: run the server).
    #[command(subcommand)]
    offline: Option<Offline>,
    /// The configuration file (TOML; see docs/ADMIN.md for every setting). Default:
    /// DATA_DIR/server.toml when it exists.
    #[arg(long, short = 'c', env = "QSM_SERVER_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Where catalog, pool, certificate and socket live unless placed elsewhere.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// A TCP address to listen on (repeatable; port 0 picks one). Default 0.0.0.0:1500.
    #[arg(long)]
    listen: Vec<String>,
    /// No TCP listener: the local socket only.
    #[arg(long, conflicts_with = "listen")]
    no_tcp: bool,
    /// Serve TCP without TLS: on loopback addresses only, unless --insecure.
    #[arg(long)]
    plaintext: bool,
    /// Allow --plaintext on addresses other machines reach (passwords and data in clear).
    #[arg(long)]
    insecure: bool,
    /// The local socket (default DATA_DIR/qsm.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The catalog: a SQLite file (put it on an SSD) or `postgres://USER@HOST:PORT/DB`.
    #[arg(long, global = true)]
    catalog: Option<PathBuf>,
    /// The storage pool directory.
    #[arg(long)]
    pool: Option<PathBuf>,
    /// The server certificate (PEM); default DATA_DIR/tls/cert.pem, generated if missing.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The server key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Objects per transaction at most (TXNGROUPMAX).
    #[arg(long, value_parser = crate::usage::range(1, TxnLimits::MAX_GROUP, "objects"))]
    txn_group_max: Option<usize>,
    /// Frame bytes per transaction at most (TXNBYTELIMIT).
    #[arg(long, value_parser = crate::usage::range(1, TxnLimits::MAX_BYTES, "bytes"))]
    txn_byte_limit: Option<u64>,
    /// Sessions open at once at most.
    #[arg(long, value_parser = crate::usage::range(1, qsm_server::config::MAX_SESSIONS, "sessions"))]
    max_sessions: Option<usize>,
    /// Clients deduplicate by default (their `--dedup` flag or `dedup` setting wins).
    #[arg(long)]
    dedup: bool,
}

/// Work on a stopped server's files.
#[derive(Debug, Subcommand)]
enum Offline {
    /// Restore the catalog from a backup (`qsm admin backup db`): the newest in the volume
    /// history, or --from FILE. The server must be stopped; the catalog it replaces is kept
    /// beside it. Backups made after the copy are not in the restored catalog: their data
    /// stays in the pool, and `qsm admin audit stgpool` reports it.
    RestoreDb {
        /// The backup file (default: the newest one the volume history lists).
        #[arg(long)]
        from: Option<PathBuf>,
    },
    /// The volume history: catalog backups and restores.
    Volhist {
        #[arg(long)]
        json: bool,
    },
}

fn print_volhist(entries: &[qsm_server::dbcopy::VolhistEntry], json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(entries)?);
        return Ok(());
    }
    outln!("{:<20} {:<10} {:>12} {:>6}  path", "time (UTC)", "kind", "bytes", "schema");
    for e in entries {
        outln!(
            "{:<20} {:<10} {:>12} {:>6}  {}{}",
            crate::client_cmd::format_time(e.time),
            e.kind,
            e.bytes,
            e.schema,
            e.path.display(),
            if e.detail.is_empty() { String::new() } else { format!(" ({})", e.detail) }
        );
    }
    Ok(())
}

pub fn server(args: ServerArgs) -> Result<bool> {
    // Without --config, the data directory's own `server.toml`, if it has one: every command
    // on a data directory (the server, restore-db, volhist) then sees the same catalog.
    let config_file = args.config.clone().or_else(|| {
        let own = args.data_dir.as_ref()?.join("server.toml");
        own.is_file().then_some(own)
    });
    // A configuration that cannot be read, is not one, or says what cannot work: bad usage.
    let mut config = match &config_file {
        Some(p) => ServerConfig::load(p).map_err(crate::usage::usage)?,
        None => ServerConfig::default(),
    };
    if let Some(d) = args.data_dir {
        config.data_dir = d;
    }
    if !args.listen.is_empty() {
        config.listen = args.listen;
    }
    if args.no_tcp {
        config.listen.clear();
    }
    config.plaintext |= args.plaintext;
    config.insecure |= args.insecure;
    config.dedup |= args.dedup;
    macro_rules! set {
        ($($field:ident),*) => { $( if args.$field.is_some() { config.$field = args.$field; } )* };
    }
    set!(socket, catalog, pool, tls_cert, tls_key);
    if let Some(n) = args.txn_group_max {
        config.txn_group_max = n;
    }
    if let Some(n) = args.txn_byte_limit {
        config.txn_byte_limit = n;
    }
    if let Some(n) = args.max_sessions {
        config.max_sessions = n;
    }
    config.validate().map_err(crate::usage::usage)?;
    match args.offline {
        Some(Offline::RestoreDb { from }) => {
            if let Some(from) = &from {
                crate::codec_cmd::open_stream(from)
                    .map_err(|e| e.context("--from: not a catalog backup"))?;
            }
            let r = qsm_server::dbcopy::restore(&config, from.as_deref())
                .map_err(anyhow::Error::msg)?;
            outln!(
                "Catalog restored from {}{}: {} object versions.",
                r.from.display(),
                r.taken
                    .map(|t| format!(" (taken {})", crate::client_cmd::format_time(t)))
                    .unwrap_or_default(),
                r.objects
            );
            if let Some(p) = r.replaced {
                outln!("The catalog it replaced is kept as {}.", p.display());
            }
            match r.missing {
                Ok((0, _)) => {}
                Ok((chunks, versions)) => outln!(
                    "{chunks} chunks were in containers reclaimed since the copy: marked damaged, with the {versions} versions using them (their files are sent again by the next backups)."
                ),
                Err(why) => outln!(
                    "The pool was not checked: {why}. Run `qsm admin audit stgpool --mark-damaged`."
                ),
            }
            outln!(
                "Versions backed up after the copy are not in the catalog; their data stays in the pool.\n\
                 Start the server and run `qsm admin audit stgpool` to see it; back those clients up again."
            );
            return Ok(true);
        }
        Some(Offline::Volhist { json }) => {
            let entries =
                qsm_server::dbcopy::volhist(&config.data_dir).map_err(anyhow::Error::msg)?;
            print_volhist(&entries, json)?;
            return Ok(true);
        }
        None => {}
    }
    config.check_tls_files().map_err(crate::usage::usage)?;
    qsm_server::run(config, |l| {
        let mut out = std::io::stdout().lock();
        for url in &l.urls {
            let _ = writeln!(out, "qsm server: listening on {url}");
        }
        if let Some(cert) = &l.certificate {
            let _ = writeln!(out, "qsm server: clients must trust {}", cert.display());
        }
        let _ = out.flush();
    })?;
    Ok(true)
}

/// How an administrator reaches the server.
#[derive(Debug, Args)]
pub struct AdminConn {
    /// The server: unix:PATH (its local socket: no login needed as the server's user or
    /// root), or https://HOST:PORT with --admin and --password-file. Without one, the
    /// embedded store in --home.
    #[arg(long, global = true, env = "QSM_SERVER")]
    server: Option<String>,
    /// The embedded store's directory, administered when no server is given (default:
    /// $QSM_HOME, or ~/.local/share/qsm).
    #[arg(long, global = true)]
    home: Option<PathBuf>,
    /// The administrator to log in as (not needed on the local socket).
    #[arg(long, global = true, env = "QSM_ADMIN")]
    admin: Option<String>,
    /// A file whose first line is the administrator's password.
    #[arg(long, global = true, env = "QSM_PASSWORD_FILE")]
    password_file: Option<PathBuf>,
    /// The server certificate to trust.
    #[arg(long, global = true, env = "QSM_CA")]
    ca: Option<PathBuf>,
    /// Allow http:// (no TLS) to a server that is not on this machine.
    #[arg(long, global = true, env = "QSM_INSECURE")]
    insecure: bool,
}

/// What `qsm admin` acts on: a server across a connection, or the embedded store opened here.
#[derive(Debug)]
enum AdminTarget {
    Remote(RemoteServer),
    Embedded(Embedded),
}

impl AdminConn {
    fn open(&self) -> Result<AdminTarget> {
        let usage = crate::usage::usage;
        let Some(url) = self.server.clone() else {
            if self.admin.is_some() {
                return Err(usage("--admin needs --server: the embedded store has no accounts"));
            }
            let home = match &self.home {
                Some(h) => h.clone(),
                None => qsm_server::embedded::default_home()?,
            };
            // Administering a store that does not exist would create an empty one.
            if !home.join("catalog.db").exists() {
                return Err(usage(&format!(
                    "no server given (--server or QSM_SERVER) and no embedded store in {}: \
                     back something up first, or say which server",
                    home.display()
                )));
            }
            let e = Embedded::open(&home)
                .with_context(|| format!("opening the QSM store in {}", home.display()))?;
            for warning in e.warnings() {
                errln!("qsm: warning: {warning}");
            }
            return Ok(AdminTarget::Embedded(e));
        };
        match &self.admin {
            None if url.starts_with("unix:") => {
                Ok(AdminTarget::Remote(remote::connect_local_admin(&url)?))
            }
            None => Err(usage(
                "give --admin NAME and --password-file, or use the server's unix: socket",
            )),
            Some(name) => {
                let file = self
                    .password_file
                    .as_ref()
                    .ok_or_else(|| usage("--admin needs --password-file"))?;
                Ok(AdminTarget::Remote(RemoteServer::connect(&RemoteOptions {
                    url,
                    account: name.clone(),
                    password: read_password(file)?,
                    admin: true,
                    ca: self.ca.clone(),
                    insecure: self.insecure,
                })?))
            }
        }
    }
}

#[derive(Debug, Args)]
pub struct AdminArgs {
    #[command(subcommand)]
    command: AdminCommand,
    #[command(flatten)]
    conn: AdminConn,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Register a client node; its password is read from --new-password-file or stdin.
    RegisterNode(Register),
    /// Register an administrator account.
    RegisterAdmin(Register),
    /// Lock a node: it cannot log in, and its sessions are cancelled.
    LockNode { name: String },
    /// Unlock a node.
    UnlockNode { name: String },
    /// Lock an administrator: it cannot log in, and its sessions are cancelled.
    LockAdmin { name: String },
    /// Unlock an administrator.
    UnlockAdmin { name: String },
    /// Remove an administrator account (it owns no data); its sessions are cancelled.
    RemoveAdmin { name: String },
    /// List nodes, sessions, processes, policy, storage pools, the activity log or the volume
    /// history.
    #[command(subcommand)]
    Query(AdminQuery),
    /// Cancel a session (its committed transactions stay).
    Cancel {
        #[command(subcommand)]
        what: CancelWhat,
    },
    /// Put a node in a dedup scope (made if new), so nodes in one scope deduplicate against
    /// each other's chunks from now on. By default each node has its own, `node:NAME`. Nodes
    /// with encryption share chunks only if they also share one master key.
    SetDedupScope { node: String, scope: String },
    /// Expire: remove what policy no longer keeps.
    #[command(subcommand)]
    Expire(ExpireWhat),
    /// Reclaim: rewrite containers whose space is mostly dead.
    #[command(subcommand)]
    Reclaim(ReclaimWhat),
    /// Define a policy domain or a management class.
    #[command(subcommand)]
    Define(DefineWhat),
    /// Change a management class, or move a node to another domain.
    #[command(subcommand)]
    Update(UpdateWhat),
    /// Give an administrator privilege classes (replacing those it had).
    #[command(subcommand)]
    Grant(GrantWhat),
    /// Back up the catalog (a consistent copy, taken while the server runs).
    #[command(subcommand)]
    Backup(BackupWhat),
    /// Audit the storage pool: read back and verify every chunk.
    #[command(subcommand)]
    Audit(AuditWhat),
    /// Delete a domain or a management class (refused while in use).
    #[command(subcommand)]
    Delete(DeleteWhat),
    /// Copy a whole catalog to another backend (SQLite to PostgreSQL or back) and verify the
    /// copy, table by table (rows and checksums). Works on the databases directly, not through
    /// a server: stop the servers using the source first, or what they write afterwards is
    /// not in the copy.
    MigrateCatalog {
        /// The catalog to copy: `sqlite:PATH` (or a path) or `postgres://USER@HOST:PORT/DB`.
        #[arg(long)]
        from: String,
        /// Where to copy it, in the same forms; created (or migrated) if new.
        #[arg(long)]
        to: String,
        /// Replace a destination that already holds a catalog (by default that is refused).
        #[arg(long)]
        replace: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum DefineWhat {
    /// A policy domain; nodes join it with `update node NAME --domain DOMAIN`.
    Domain {
        name: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// A management class with its copy groups (unset: TSM's defaults, 2 / 1 / 30 / 60 and
    /// 365 days). The class called `standard` is its domain's default.
    Mgmtclass {
        domain: String,
        name: String,
        #[command(flatten)]
        groups: CopyGroups,
    },
}

#[derive(Debug, Subcommand)]
enum UpdateWhat {
    /// Change a management class's copy groups (unset values stay).
    Mgmtclass {
        domain: String,
        name: String,
        #[command(flatten)]
        groups: CopyGroups,
    },
    /// Move a node to another domain, or change its password (--new-password-file, or
    /// --password to read it from stdin).
    Node {
        name: String,
        #[arg(long)]
        domain: Option<String>,
        #[command(flatten)]
        password: NewPassword,
    },
    /// Change an administrator's password (your own, or any with system privilege).
    Admin {
        name: String,
        #[command(flatten)]
        password: NewPassword,
    },
}

/// A new password for an existing account.
#[derive(Debug, Args)]
struct NewPassword {
    /// A file whose first line is the new password.
    #[arg(long)]
    new_password_file: Option<PathBuf>,
    /// Read the new password from the first line of stdin.
    #[arg(long, conflicts_with = "new_password_file")]
    password: bool,
}

impl NewPassword {
    /// Whether a new password is given (to be read).
    fn given(&self) -> bool {
        self.password || self.new_password_file.is_some()
    }

    /// The new password, if one is given.
    fn read(&self) -> Result<Option<String>> {
        if self.password {
            return password_from_stdin().map(Some);
        }
        self.new_password_file.as_deref().map(read_password).transpose()
    }
}

#[derive(Debug, Subcommand)]
enum DeleteWhat {
    /// A domain and its classes: refused while nodes belong to it or versions use its classes.
    Domain { name: String },
    /// A management class: refused while versions are bound to it.
    Mgmtclass { domain: String, name: String },
    /// A node's filespace with every version in it (cannot be undone; the node's sessions
    /// are cancelled first).
    Filespace {
        node: String,
        filespace: String,
        #[arg(long)]
        json: bool,
    },
    /// A node: refused while it has filespaces.
    Node { name: String },
}

/// Copy-group values: a count or number of days, or `nolimit`.
#[derive(Debug, Args)]
struct CopyGroups {
    /// Versions kept while the file exists, the active one included.
    #[arg(long, value_parser = crate::usage::or_nolimit(1, "versions"), allow_negative_numbers = true)]
    versions_exist: Option<u32>,
    /// Inactive versions kept after the file was deleted.
    #[arg(long, value_parser = crate::usage::or_nolimit(0, "versions"), allow_negative_numbers = true)]
    versions_deleted: Option<u32>,
    /// Days an inactive version is kept (but the last of a deleted file).
    #[arg(long, value_parser = crate::usage::or_nolimit(0, "days"), allow_negative_numbers = true)]
    retain_extra: Option<u32>,
    /// Days the last inactive version of a deleted file is kept.
    #[arg(long, value_parser = crate::usage::or_nolimit(0, "days"), allow_negative_numbers = true)]
    retain_only: Option<u32>,
    /// Days an archive is kept.
    #[arg(long, value_parser = crate::usage::or_nolimit(0, "days"), allow_negative_numbers = true)]
    retain_archive: Option<u32>,
}

impl CopyGroups {
    fn request(&self, domain: &str, name: &str) -> v1::MgmtClassRequest {
        v1::MgmtClassRequest {
            domain: domain.to_owned(),
            name: name.to_owned(),
            versions_exist: self.versions_exist,
            versions_deleted: self.versions_deleted,
            retain_extra_days: self.retain_extra,
            retain_only_days: self.retain_only,
            retain_version_days: self.retain_archive,
        }
    }
}

/// One privilege class of a comma-separated `--privilege` list, checked as the server reads
/// it (`none` for none) before anything is asked of it.
fn privilege(text: &str) -> std::result::Result<String, String> {
    qsm_types::model::Privilege::parse_list(text).map(|_| text.trim().to_owned())
}

/// The longest expiration that may be asked for (TSM's largest DURATION=).
const MAX_DURATION_MINUTES: u32 = 999_999;

#[derive(Debug, Subcommand)]
enum ReclaimWhat {
    /// Copy the live frames of containers at least PCT% reclaimable into new containers and
    /// delete the old ones (and containers no catalog record names). Runs as a server process
    /// (`query process`, `cancel process`).
    Stgpool {
        /// Reclaimable share of a container that makes it worth rewriting (TSM's RECLAIM=).
        #[arg(long, default_value_t = 60, value_parser = crate::usage::range(1u32, 100, "percent"))]
        threshold: u32,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum ExpireWhat {
    /// Remove inactive backup versions and archives past their management class's limits
    /// (versions-exist, versions-deleted, retain-extra, retain-only; archive retention), and
    /// release their chunks for reclamation. Runs as a server process (`query process`,
    /// `cancel process`); a cancelled or timed-out run is simply run again.
    Inventory {
        /// Worker threads, each taking whole filespaces (TSM's RESOURCE=; default 4).
        #[arg(long, default_value_t = 4, value_parser = crate::usage::range(1, MAX_EXPIRE_WORKERS, "workers"))]
        resource: u32,
        /// Only this node (repeatable).
        #[arg(long)]
        node: Vec<String>,
        /// Stop after this many minutes (TSM's DURATION=).
        #[arg(long, value_parser = crate::usage::range(1, MAX_DURATION_MINUTES, "minutes"))]
        duration: Option<u32>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
struct Register {
    name: String,
    /// A file whose first line is the new password (default: the first line of stdin).
    #[arg(long)]
    new_password_file: Option<PathBuf>,
    /// For an administrator: privilege classes, comma-separated: system, policy, storage,
    /// operator (default: none, queries only).
    #[arg(long, value_delimiter = ',', value_parser = privilege)]
    privilege: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum AdminQuery {
    /// Sessions open now, with bytes, objects and throughput.
    Session {
        #[arg(long)]
        json: bool,
    },
    /// Registered nodes.
    Node {
        #[arg(long)]
        json: bool,
    },
    /// Server processes running now (expiration, ...), with their progress.
    Process {
        #[arg(long)]
        json: bool,
    },
    /// Policy domains, their nodes, and their management classes with their copy groups.
    Domain {
        #[arg(long)]
        json: bool,
    },
    /// The volume history: catalog backups and restores.
    Volhist {
        #[arg(long)]
        json: bool,
    },
    /// Storage pools: containers, bytes, how much is live (the rest is reclaimable), damage.
    Stgpool {
        #[arg(long)]
        json: bool,
    },
    /// The activity log: logins, session ends, administrative actions, processes, warnings.
    Actlog {
        /// From this time (UTC; as `qsm restore --pit` takes it; default: the last 24 hours).
        #[arg(long, value_parser = crate::client_cmd::parse_time)]
        since: Option<i64>,
        /// Only entries containing this text (case-insensitive).
        #[arg(long)]
        search: Option<String>,
        /// At most this many entries, the newest.
        #[arg(long, default_value_t = 1000, value_parser = crate::usage::range(1, MAX_ACTLOG_ENTRIES, "entries"))]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum GrantWhat {
    /// `grant authority NAME --privilege system|policy,storage,operator` (none: queries only).
    Authority {
        name: String,
        #[arg(long, value_delimiter = ',', required = true, value_parser = privilege)]
        privilege: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
enum BackupWhat {
    /// The catalog, compressed as a QSM stream, recorded in the volume history.
    Db {
        /// A file or directory on the server (default: DATA_DIR/dbbackup).
        #[arg(long)]
        to: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum AuditWhat {
    /// Every container of the pool (or --container ID...): damaged chunks and the versions
    /// using them, and containers the catalog does not know.
    Stgpool {
        /// Mark damaged chunks and versions: the next backup of those files sends them again.
        #[arg(long)]
        mark_damaged: bool,
        /// After a catalog restore: let reclamation delete containers the catalog does not
        /// know (the data of backups made after the copy; it cannot be restored by name).
        #[arg(long)]
        release_unknown: bool,
        /// Only this container (hex, as reported; repeatable).
        #[arg(long, value_parser = parse_hex)]
        container: Vec<u64>,
        #[arg(long)]
        json: bool,
    },
}

fn parse_hex(text: &str) -> std::result::Result<u64, String> {
    u64::from_str_radix(text.trim_start_matches("0x"), 16)
        .map_err(|e| format!("{text:?} is not a container id in hex: {e}"))
}

#[derive(Debug, Subcommand)]
enum CancelWhat {
    /// A session by number (from `qsm admin query session`).
    Session { id: u64 },
    /// A process by number (from `qsm admin query process`): it stops at its next
    /// transaction boundary, keeping what it committed.
    Process { id: u64 },
}

fn new_password(r: &Register) -> Result<String> {
    match &r.new_password_file {
        Some(p) => read_password(p),
        None => password_from_stdin(),
    }
}

/// `qsm admin migrate-catalog`.
fn migrate_catalog(from: &str, to: &str, replace: bool, json: bool) -> Result<bool> {
    use qsm_catalog::AnyCatalog;
    if !qsm_catalog::is_postgres(from) {
        let path = std::path::Path::new(from.strip_prefix("sqlite:").unwrap_or(from));
        if !path.is_file() {
            return Err(crate::usage::usage(format!(
                "the source catalog {} does not exist",
                path.display()
            )));
        }
    }
    // A file that is not a catalog (or one newer than this program) was named by mistake.
    let open = |url: &str, what: &str| {
        AnyCatalog::open(url).map_err(|e| {
            let what = format!("opening the {what} {}", qsm_catalog::redact(url));
            match e {
                qsm_catalog::CatalogError::NotADatabase { .. }
                | qsm_catalog::CatalogError::TooNew { .. } => {
                    crate::usage::usage(format!("{what}: {e}"))
                }
                e => anyhow::Error::new(e).context(what),
            }
        })
    };
    let source = open(from, "source catalog")?;
    let dest = open(to, "destination")?;
    let held = qsm_catalog::copy::digest(dest.tables())?;
    // A new catalog holds only the rows its migrations insert (the catalog state).
    let rows: u64 = held.tables.iter().filter(|t| t.0 != "catalog_state").map(|t| t.1).sum();
    if rows > 0 && !replace {
        bail!(
            "{} already holds a catalog ({rows} rows): give --replace to overwrite it",
            dest.tables().describe()
        );
    }
    let started = std::time::Instant::now();
    let digest = qsm_catalog::copy::copy_catalog(source.tables(), dest.tables())?;
    let seconds = started.elapsed().as_secs_f64();
    if json {
        let tables: Vec<_> = digest
            .tables
            .iter()
            .map(|(t, n, h)| {
                let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
                serde_json::json!({"table": t, "rows": n, "blake3": hex})
            })
            .collect();
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "from": source.tables().describe(),
                "to": dest.tables().describe(),
                "rows": digest.rows(),
                "seconds": seconds,
                "verified": true,
                "tables": tables,
            }))?
        );
    } else {
        for (t, n, _) in &digest.tables {
            outln!("{t:<20} {n:>12} rows");
        }
        outln!(
            "Copied {} rows from {} to {} in {seconds:.1} s; every table's rows and checksum verified.",
            digest.rows(),
            source.tables().describe(),
            dest.tables().describe()
        );
    }
    Ok(true)
}

/// Refuses (exit 2) what the options alone show cannot work, and reads the new password a
/// command sets, both before the server is reached: a bad password file is named before any
/// connection is tried.
fn before_connecting(command: &AdminCommand) -> Result<Option<String>> {
    let why = match command {
        AdminCommand::RegisterNode(r) if !r.privilege.is_empty() => {
            "--privilege is for administrators: a node has no privilege classes"
        }
        AdminCommand::Update(UpdateWhat::Node { domain: None, password, .. })
            if !password.given() =>
        {
            "say what to change: --domain, --new-password-file or --password"
        }
        AdminCommand::Update(UpdateWhat::Admin { password, .. }) if !password.given() => {
            "give the new password: --new-password-file or --password"
        }
        AdminCommand::RegisterNode(r) | AdminCommand::RegisterAdmin(r) => {
            return new_password(r).map(Some);
        }
        AdminCommand::Update(
            UpdateWhat::Node { password, .. } | UpdateWhat::Admin { password, .. },
        ) => {
            return password.read();
        }
        _ => return Ok(None),
    };
    Err(crate::usage::usage(why))
}

fn set_admin_locked(server: &dyn AdminApi, name: &str, locked: bool) -> Result<()> {
    server.set_admin_locked(v1::LockRequest { name: name.to_owned(), locked })?;
    outln!("Administrator {name} {}.", if locked { "locked" } else { "unlocked" });
    Ok(())
}

pub fn admin(args: AdminArgs) -> Result<bool> {
    if let AdminCommand::MigrateCatalog { from, to, replace, json } = &args.command {
        return migrate_catalog(from, to, *replace, *json);
    }
    let new_password = before_connecting(&args.command)?;
    // Given by `before_connecting` to the commands that set one.
    let new_password = || new_password.clone().context("no new password was read");
    let target = args.conn.open()?;
    // The embedded store's user can read its files, so holds system privilege, as the
    // server's own user does on its local socket.
    let session;
    let server: &dyn AdminApi = match &target {
        AdminTarget::Remote(r) => r,
        AdminTarget::Embedded(e) => {
            let uid = rustix::process::geteuid().as_raw();
            session = e.admin(format!("the embedded store's user (uid {uid})"));
            &session
        }
    };
    match args.command {
        AdminCommand::RegisterNode(r) => {
            let password = new_password()?;
            server.register_node(v1::RegisterRequest {
                name: r.name.clone(),
                password,
                privileges: Vec::new(),
            })?;
            outln!("Node {} registered.", r.name);
        }
        AdminCommand::RegisterAdmin(r) => {
            let password = new_password()?;
            server.register_admin(v1::RegisterRequest {
                name: r.name.clone(),
                password,
                privileges: r.privilege.clone(),
            })?;
            outln!(
                "Administrator {} registered with {} privilege.",
                r.name,
                if r.privilege.is_empty() { "no".to_owned() } else { r.privilege.join(",") }
            );
        }
        AdminCommand::LockNode { name } => {
            server.set_node_locked(v1::LockRequest { name: name.clone(), locked: true })?;
            outln!("Node {name} locked.");
        }
        AdminCommand::UnlockNode { name } => {
            server.set_node_locked(v1::LockRequest { name: name.clone(), locked: false })?;
            outln!("Node {name} unlocked.");
        }
        AdminCommand::Query(AdminQuery::Node { json }) => {
            let nodes = server.query_nodes(v1::Empty {})?.nodes;
            if json {
                let rows: Vec<_> = nodes
                    .iter()
                    .map(|n| serde_json::json!({"name": n.name, "locked": n.locked, "registered": n.registered}))
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for n in nodes {
                    outln!("{:<24} {}", n.name, if n.locked { "locked" } else { "" });
                }
            }
        }
        AdminCommand::Query(AdminQuery::Session { json }) => {
            let sessions = server.query_sessions(v1::Empty {})?.sessions;
            let now = qsm_types::now();
            let rate = |s: &v1::SessionInfo| s.bytes as f64 / (now - s.started).max(1) as f64;
            if json {
                let rows: Vec<_> = sessions
                    .iter()
                    .map(|s| serde_json::json!({"id": s.id, "account": s.account, "admin": s.admin, "client": s.client, "peer": s.peer, "started": s.started, "bytes": s.bytes, "objects": s.objects, "bytes_per_second": rate(s), "state": s.state, "server": s.server}))
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                // Servers sharing a catalog list each other's sessions: then each says where.
                let several = sessions.iter().any(|s| s.server != sessions[0].server);
                let on = |s: &v1::SessionInfo| {
                    if several { format!("  (on {})", s.server) } else { String::new() }
                };
                outln!(
                    "{:>6}  {:<16} {:<9} {:>12} {:>9} {:>10}  {:<24} client",
                    "id",
                    "account",
                    "state",
                    "bytes",
                    "objects",
                    "MB/s",
                    "peer"
                );
                for s in &sessions {
                    outln!(
                        "{:>6}  {:<16} {:<9} {:>12} {:>9} {:>10.2}  {:<24} {}{}",
                        s.id,
                        if s.admin { format!("{} (admin)", s.account) } else { s.account.clone() },
                        s.state,
                        s.bytes,
                        s.objects,
                        rate(s) / 1e6,
                        s.peer,
                        s.client,
                        on(s)
                    );
                }
            }
        }
        AdminCommand::Cancel { what: CancelWhat::Session { id } } => {
            server.cancel_session(v1::CancelRequest { session: id })?;
            outln!("Session {id} cancelled.");
        }
        AdminCommand::SetDedupScope { node, scope } => {
            server.set_dedup_scope(v1::DedupScopeRequest {
                node: node.clone(),
                scope: scope.clone(),
            })?;
            outln!("Node {node} deduplicates in scope {scope}.");
        }
        AdminCommand::Expire(ExpireWhat::Inventory { resource, node, duration, json }) => {
            let r = server.expire_inventory(v1::ExpireRequest {
                resource,
                nodes: node,
                duration_minutes: duration.unwrap_or(0),
            })?;
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"process": r.process, "examined": r.examined, "backups": r.backups, "archives": r.archives, "filespaces": r.filespaces, "stopped": (!r.stopped.is_empty()).then_some(&r.stopped), "seconds": r.seconds})
                );
            } else {
                outln!(
                    "Process {}: expire inventory {}: examined {} versions, deleted {} backup versions and {} archives in {} filespaces, {:.1} s ({:.0} versions/s).",
                    r.process,
                    if r.stopped.is_empty() { "ended".to_owned() } else { r.stopped.clone() },
                    r.examined,
                    r.backups,
                    r.archives,
                    r.filespaces,
                    r.seconds,
                    (r.backups + r.archives) as f64 / r.seconds.max(1e-9)
                );
            }
        }
        AdminCommand::Query(AdminQuery::Process { json }) => {
            let list = server.query_processes(v1::Empty {})?.processes;
            if json {
                let rows: Vec<_> = list
                    .iter()
                    .map(|p| serde_json::json!({"id": p.id, "kind": p.kind, "started": p.started, "progress": p.progress, "server": p.server}))
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let several = list.iter().any(|p| p.server != list[0].server);
                for p in &list {
                    let on = if several { format!("  (on {})", p.server) } else { String::new() };
                    outln!("{:>6}  {:<18} {}{on}", p.id, p.kind, p.progress);
                }
            }
        }
        AdminCommand::Define(DefineWhat::Domain { name, description }) => {
            server.define_domain(v1::DomainRequest { name: name.clone(), description })?;
            outln!("Domain {name} defined.");
        }
        AdminCommand::Define(DefineWhat::Mgmtclass { domain, name, groups }) => {
            server.define_mgmt_class(groups.request(&domain, &name))?;
            outln!("Management class {domain}/{name} defined.");
        }
        AdminCommand::Update(UpdateWhat::Mgmtclass { domain, name, groups }) => {
            server.update_mgmt_class(groups.request(&domain, &name))?;
            outln!("Management class {domain}/{name} updated.");
        }
        AdminCommand::Update(UpdateWhat::Node { name, domain, .. }) => {
            let password = new_password().ok();
            server.update_node(v1::UpdateNodeRequest {
                name: name.clone(),
                domain: domain.clone().unwrap_or_default(),
                password: password.clone(),
            })?;
            if let Some(domain) = domain {
                outln!("Node {name} is in domain {domain}.");
            }
            if password.is_some() {
                outln!("Node {name} has a new password.");
            }
        }
        AdminCommand::Update(UpdateWhat::Admin { name, .. }) => {
            let password = new_password()?;
            server.update_admin(v1::PasswordRequest { name: name.clone(), password })?;
            outln!("Administrator {name} has a new password.");
        }
        AdminCommand::LockAdmin { name } => set_admin_locked(server, &name, true)?,
        AdminCommand::UnlockAdmin { name } => set_admin_locked(server, &name, false)?,
        AdminCommand::RemoveAdmin { name } => {
            server.remove_admin(v1::NodeName { name: name.clone() })?;
            outln!("Administrator {name} removed.");
        }
        AdminCommand::Delete(DeleteWhat::Filespace { node, filespace, json }) => {
            let r = server.delete_filespace(v1::DeleteFilespaceRequest {
                node: node.clone(),
                filespace: filespace.clone(),
            })?;
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"process": r.process, "versions": r.versions, "stopped": (!r.stopped.is_empty()).then_some(&r.stopped), "seconds": r.seconds})
                );
            } else {
                outln!(
                    "Process {}: filespace {filespace} of node {node} {}: {} versions deleted, {:.1} s.",
                    r.process,
                    if r.stopped.is_empty() { "deleted" } else { "partly deleted (cancelled)" },
                    r.versions,
                    r.seconds
                );
            }
        }
        AdminCommand::MigrateCatalog { .. } => unreachable!("handled before connecting"),
        AdminCommand::Delete(DeleteWhat::Node { name }) => {
            server.delete_node(v1::NodeName { name: name.clone() })?;
            outln!("Node {name} deleted.");
        }
        AdminCommand::Delete(DeleteWhat::Domain { name }) => {
            server.delete_domain(v1::DomainRequest {
                name: name.clone(),
                description: String::new(),
            })?;
            outln!("Domain {name} deleted.");
        }
        AdminCommand::Delete(DeleteWhat::Mgmtclass { domain, name }) => {
            let request = v1::MgmtClassRequest {
                domain: domain.clone(),
                name: name.clone(),
                ..Default::default()
            };
            server.delete_mgmt_class(request)?;
            outln!("Management class {domain}/{name} deleted.");
        }
        AdminCommand::Query(AdminQuery::Domain { json }) => {
            let list = server.query_policy(v1::Empty {})?.domains;
            let n = |v: u32| {
                if v == qsm_catalog::expire::NO_LIMIT {
                    "nolimit".to_owned()
                } else {
                    v.to_string()
                }
            };
            if json {
                let rows: Vec<_> = list
                    .iter()
                    .map(|d| serde_json::json!({"name": d.name, "description": d.description, "nodes": d.nodes, "classes": d.classes.iter().map(|c| serde_json::json!({"name": c.name, "versions_exist": c.versions_exist, "versions_deleted": c.versions_deleted, "retain_extra_days": c.retain_extra_days, "retain_only_days": c.retain_only_days, "retain_version_days": c.retain_version_days})).collect::<Vec<_>>()}))
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for d in &list {
                    outln!("{}  ({} nodes) {}", d.name, d.nodes.len(), d.description);
                    for c in &d.classes {
                        outln!(
                            "  {:<16} versions-exist {}, versions-deleted {}, retain-extra {}, retain-only {}, retain-archive {}",
                            c.name,
                            n(c.versions_exist),
                            n(c.versions_deleted),
                            n(c.retain_extra_days),
                            n(c.retain_only_days),
                            n(c.retain_version_days)
                        );
                    }
                }
            }
        }
        AdminCommand::Reclaim(ReclaimWhat::Stgpool { threshold, json }) => {
            let r = server.reclaim_stgpool(v1::ReclaimRequest { threshold_percent: threshold })?;
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"process": r.process, "containers": r.containers, "orphans": r.orphans, "orphans_skipped": r.orphans_skipped, "stopped": (!r.stopped.is_empty()).then_some(&r.stopped), "seconds": r.seconds})
                );
            } else {
                let orphans = if r.orphans_skipped {
                    "orphan removal skipped (servers may share the pool)".to_owned()
                } else {
                    format!("{} orphan containers removed", r.orphans)
                };
                outln!(
                    "Process {}: reclaim stgpool {}: {} containers reclaimed, {orphans}, {:.1} s.",
                    r.process,
                    if r.stopped.is_empty() { "ended" } else { r.stopped.as_str() },
                    r.containers,
                    r.seconds
                );
            }
        }
        AdminCommand::Grant(GrantWhat::Authority { name, privilege }) => {
            server.grant_authority(v1::GrantRequest {
                name: name.clone(),
                privileges: privilege.clone(),
            })?;
            outln!("Administrator {name} has {} privilege.", privilege.join(","));
        }
        AdminCommand::Backup(BackupWhat::Db { to, json }) => {
            let r = server.backup_db(v1::BackupDbRequest {
                to: to.map(|p| p.display().to_string()).unwrap_or_default(),
            })?;
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"process": r.process, "path": r.path, "bytes": r.bytes, "catalog_bytes": r.catalog_bytes, "schema": r.schema, "seconds": r.seconds})
                );
            } else {
                outln!(
                    "Process {}: catalog backed up to {}: {} bytes of catalog (schema {}) in {} bytes, {:.1} s.",
                    r.process,
                    r.path,
                    r.catalog_bytes,
                    r.schema,
                    r.bytes,
                    r.seconds
                );
            }
        }
        AdminCommand::Query(AdminQuery::Stgpool { json }) => {
            let pools = server.query_stgpool(v1::Empty {})?.pools;
            let pct = |p: &v1::StgpoolInfo| {
                if p.bytes == 0 {
                    0.0
                } else {
                    100.0 * (1.0 - p.live_bytes as f64 / p.bytes as f64)
                }
            };
            if json {
                let rows: Vec<_> = pools
                    .iter()
                    .map(|p| serde_json::json!({"name": p.name, "kind": p.kind, "location": p.location, "containers": p.containers, "bytes": p.bytes, "chunks": p.chunks, "live_bytes": p.live_bytes, "reclaimable_percent": pct(p), "damaged_chunks": p.damaged_chunks}))
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                outln!(
                    "{:<16} {:<5} {:>10} {:>14} {:>14} {:>12} {:>8}  location",
                    "pool",
                    "kind",
                    "containers",
                    "bytes",
                    "live bytes",
                    "reclaimable",
                    "damaged"
                );
                for p in &pools {
                    outln!(
                        "{:<16} {:<5} {:>10} {:>14} {:>14} {:>11.1}% {:>8}  {}",
                        p.name,
                        p.kind,
                        p.containers,
                        p.bytes,
                        p.live_bytes,
                        pct(p),
                        p.damaged_chunks,
                        p.location
                    );
                }
            }
        }
        AdminCommand::Query(AdminQuery::Volhist { json }) => {
            let entries: Vec<qsm_server::dbcopy::VolhistEntry> = server
                .query_volhist(v1::Empty {})?
                .entries
                .into_iter()
                .map(|e| qsm_server::dbcopy::VolhistEntry {
                    time: e.time,
                    kind: e.kind,
                    path: PathBuf::from(e.path),
                    bytes: e.bytes,
                    schema: e.schema,
                    catalog_bytes: 0,
                    detail: e.detail,
                })
                .collect();
            print_volhist(&entries, json)?;
        }
        AdminCommand::Audit(AuditWhat::Stgpool {
            mark_damaged,
            release_unknown,
            container,
            json,
        }) => {
            let r = server.audit_stgpool(v1::AuditRequest {
                mark_damaged,
                release_unknown,
                containers: container,
            })?;
            if json {
                let damaged: Vec<_> = r.damaged.iter().map(|d| serde_json::json!({"chunk": d.chunk, "container": format!("{:016x}", d.container), "offset": d.offset, "reason": d.reason})).collect();
                outln!(
                    "{}",
                    serde_json::json!({"process": r.process, "containers": r.containers, "chunks_read": r.chunks_read, "bytes_read": r.bytes_read, "damaged": damaged, "damaged_objects": r.damaged_objects, "marked": r.marked, "unknown_containers": r.unknown_containers.iter().map(|c| format!("{c:016x}")).collect::<Vec<_>>(), "unknown_bytes": r.unknown_bytes, "unrecorded_bytes": r.unrecorded_bytes, "restored_at": (r.restored_at != 0).then_some(r.restored_at), "released": r.released, "stopped": (!r.stopped.is_empty()).then_some(&r.stopped), "seconds": r.seconds})
                );
            } else {
                outln!(
                    "Process {}: audit stgpool {}: {} containers, {} chunks ({} bytes) verified, {:.1} s.",
                    r.process,
                    if r.stopped.is_empty() { "ended" } else { r.stopped.as_str() },
                    r.containers,
                    r.chunks_read,
                    r.bytes_read,
                    r.seconds
                );
                for d in &r.damaged {
                    outln!(
                        "damaged: chunk {} in container {:016x} at {}: {}",
                        d.chunk,
                        d.container,
                        d.offset,
                        d.reason
                    );
                }
                for o in &r.damaged_objects {
                    outln!("damaged version: {o}");
                }
                if !r.damaged.is_empty() {
                    outln!(
                        "{} damaged chunks in {} versions{}.",
                        r.damaged.len(),
                        r.damaged_objects.len(),
                        if r.marked {
                            ": marked; the next backup of those files sends them again"
                        } else {
                            "; --mark-damaged makes the next backup of those files send them again"
                        }
                    );
                }
                if !r.unknown_containers.is_empty() {
                    outln!(
                        "{} containers ({} bytes) the catalog does not know: {}",
                        r.unknown_containers.len(),
                        r.unknown_bytes,
                        r.unknown_containers
                            .iter()
                            .map(|c| format!("{c:016x}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    );
                }
                if r.unrecorded_bytes > 0 {
                    outln!(
                        "{} bytes in known containers past what the catalog recorded.",
                        r.unrecorded_bytes
                    );
                }
                if r.restored_at != 0 {
                    outln!(
                        "The catalog was restored from a copy at {}: the unknown data above holds backups made after the copy, which the catalog cannot name; back those clients up again. {}",
                        crate::client_cmd::format_time(r.restored_at),
                        if r.released {
                            "Released: reclamation may now delete it."
                        } else {
                            "Reclamation keeps it until `--release-unknown`."
                        }
                    );
                }
            }
            if !r.damaged.is_empty() {
                return Ok(false);
            }
        }
        AdminCommand::Query(AdminQuery::Actlog { since, search, limit, json }) => {
            let since = since.unwrap_or_else(|| qsm_types::now() - 86_400);
            let r = server.query_actlog(v1::ActlogRequest {
                since,
                search: search.unwrap_or_default(),
                limit,
            })?;
            if json {
                let rows: Vec<_> = r
                    .entries
                    .iter()
                    .map(|e| serde_json::json!({"time": e.time, "severity": e.severity, "message": e.message}))
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for e in &r.entries {
                    outln!(
                        "{}  {:<7}  {}",
                        crate::client_cmd::format_time(e.time),
                        e.severity,
                        e.message
                    );
                }
            }
            if r.truncated {
                errln!(
                    "qsm: warning: more entries matched than were returned: narrow --since or --search, or raise --limit"
                );
            }
        }
        AdminCommand::Cancel { what: CancelWhat::Process { id } } => {
            server.cancel_process(v1::ProcessRequest { process: id })?;
            outln!("Process {id} is stopping.");
        }
    }
    Ok(true)
}
