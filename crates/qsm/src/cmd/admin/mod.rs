//! `qsm admin`: the server's administration, or the embedded store's when no server is given.
//! Requests and their reports come from `qsm_proto::Admin`; this module reads the options,
//! reaches the target and renders what comes back.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use qsm_client::remote::{self, RemoteOptions, RemoteServer};
use qsm_proto::reports::DeleteFilespaceReport;
use qsm_proto::{Admin, AdminApi};
use qsm_server::Embedded;
use qsm_server::admin::{MAX_ACTLOG_ENTRIES, MAX_EXPIRE_WORKERS};

use crate::conn::{password_from_stdin, read_password};
use crate::render::emit;

mod text;

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
    /// List nodes, filespaces, sessions, processes, schedules and their events, policy, storage
    /// pools, the activity log or the volume history.
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
    /// Hold a node's versions, or one filespace's: none is deleted (expiration, roll-off,
    /// delete filespace), by anyone, until released. Needs system privilege.
    #[command(subcommand)]
    Hold(HoldWhat),
    /// Release a hold, or with --suspect acknowledge a suspect backup (the server's hold of
    /// a backup far outside its filespace's usual changes: see query hold).
    #[command(subcommand)]
    Release(ReleaseWhat),
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
    /// Copy nodes' versions to another QSM server (`define server`): only what it lacks,
    /// deduplicated against what it holds, encrypted data as is; resumable. The node can
    /// then log in and restore there (`qsm restore --server SOURCE,REPLICA`).
    #[command(subcommand)]
    Replicate(ReplicateWhat),
    /// Repair the chunks an audit marked damaged (`audit stgpool --mark-damaged`) from the
    /// copies on a replication target, without a new backup.
    #[command(subcommand)]
    Repair(RepairWhat),
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
enum HoldWhat {
    /// Hold all of a node's versions, or with --filespace one filespace's.
    Node {
        /// The node.
        name: String,
        /// Only this filespace of the node (its name as `query filespace` shows it).
        #[arg(long)]
        filespace: Option<String>,
        /// Why, for the activity log and query hold.
        #[arg(long, default_value = "")]
        reason: String,
    },
}

#[derive(Debug, Subcommand)]
enum ReleaseWhat {
    /// Release the hold on a node, or with --filespace on one filespace.
    Node {
        /// The node.
        name: String,
        /// The filespace held (`query hold` lists them).
        #[arg(long)]
        filespace: Option<String>,
        /// Acknowledge the suspect backup the server held the filespace for: its older
        /// versions may roll off and expire again.
        #[arg(long, requires = "filespace")]
        suspect: bool,
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
    /// A schedule, with its windows (times in UTC): one the server runs by itself (expire,
    /// reclaim, audit, backup-db, replicate), or one its nodes' schedulers run (incremental,
    /// selective, archive; `define association` names the nodes, `qsm sched` runs it on
    /// each). Each run is an event (`query event`).
    Schedule {
        /// The policy domain it belongs to.
        domain: String,
        /// Its name in the domain.
        name: String,
        #[command(flatten)]
        spec: ScheduleArgs,
    },
    /// Have a client schedule run for nodes of its domain (TSM's DEFINE ASSOCIATION): each
    /// node's `qsm sched` runs it in its windows; a window a node lets pass is missed.
    Association {
        /// The schedule's policy domain.
        domain: String,
        /// A client schedule (incremental, selective or archive).
        schedule: String,
        /// Nodes of that domain.
        #[arg(required = true)]
        nodes: Vec<String>,
    },
    /// A client option set (TSM's DEFINE CLOPTSET): options the server gives the nodes using
    /// it (`update node NAME --cloptset SET`).
    Cloptset {
        /// Its name: 1 to 64 letters, digits, '.', '_' or '-'.
        name: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// A server to replicate nodes to (TSM's DEFINE SERVER): its address, the certificate
    /// its TLS must prove, and a replication account on it (`register-admin NAME
    /// --privilege replication` there), whose password is read from --account-password-file.
    Server {
        /// Its name here.
        name: String,
        /// https://HOST:PORT (http:// only on this machine's loopback).
        #[arg(long)]
        address: String,
        /// The PEM certificate (or CA) its TLS must chain to: its DATA_DIR/tls/cert.pem.
        #[arg(long, value_name = "PEM")]
        cert: Option<PathBuf>,
        /// The replication account there.
        #[arg(long)]
        account: String,
        /// A file whose first line is that account's password (kept in this server's catalog).
        #[arg(long = "account-password-file")]
        account_password_file: PathBuf,
    },
    /// An option of a client option set (TSM's DEFINE CLIENTOPT), named as in client.toml:
    /// include, exclude (several add up), compression, dedup, encryption (on|off),
    /// limit_upload, txn_group_max, txn_byte_limit, threads. It fills in what a node's flags
    /// and client.toml leave unset; with --force it overrides them. Patterns always add to
    /// the node's own.
    Clientopt {
        /// The option set.
        set: String,
        /// The option, as client.toml names it.
        option: String,
        /// Its value, as client.toml writes it (on|off for dedup and encryption).
        value: String,
        /// Override the node's own flags and client.toml.
        #[arg(long)]
        force: bool,
    },
}

/// What a schedule says; on update, what is given changes.
#[derive(Debug, Clone, clap::Args)]
struct ScheduleArgs {
    /// expire, reclaim, audit, backup-db or replicate (run by the server); incremental,
    /// selective or archive (run by the associated nodes' `qsm sched`).
    #[arg(long)]
    action: Option<String>,
    /// The paths a client action backs up or archives (an incremental with none: each of the
    /// node's filespaces); for replicate, the nodes (and target=SERVER, optionally).
    #[arg(long = "objects", num_args = 1..)]
    objects: Vec<String>,
    /// The first window's start, UTC: HH:MM (today), "YYYY-MM-DD HH:MM" or @SECONDS.
    #[arg(long, value_parser = schedule_start)]
    start: Option<i64>,
    /// How long each window stays open for the action to start: 90s, 30m, 1h, 1d.
    #[arg(long, value_parser = crate::usage::seconds)]
    duration: Option<i64>,
    /// From one window to the next: 1d, 1w, 12h, 30s.
    #[arg(long, value_parser = crate::usage::seconds)]
    period: Option<i64>,
    /// Only on these weekdays (mon,tue,...; UTC); `--days all` for every day again.
    #[arg(long, value_delimiter = ',')]
    days: Vec<String>,
}

impl ScheduleArgs {
    fn request(self, domain: String, name: String) -> qsm_proto::v1::ScheduleRequest {
        let every = self.days.iter().any(|d| d == "all");
        qsm_proto::v1::ScheduleRequest {
            domain,
            name,
            action: self.action,
            set_objects: !self.objects.is_empty(),
            objects: self.objects,
            start: self.start,
            duration: self.duration,
            period: self.period,
            set_days: every || !self.days.is_empty(),
            days: if every { Vec::new() } else { self.days },
        }
    }
}

/// A window's start: `HH:MM` today (UTC), or a time `parse_time` reads.
fn schedule_start(text: &str) -> Result<i64, String> {
    if let Some((h, m)) = text.split_once(':')
        && !text.contains([' ', '-', 'T'])
    {
        let (h, m): (i64, i64) = match (h.parse(), m.parse()) {
            (Ok(h), Ok(m)) if (0..24).contains(&h) && (0..60).contains(&m) => (h, m),
            _ => return Err(format!("invalid time of day {text:?} (e.g. 02:30)")),
        };
        let today = qsm_types::now().div_euclid(86_400) * 86_400;
        return Ok(today + h * 3600 + m * 60);
    }
    qsm_types::time::parse_time(text)
}

#[derive(Debug, Subcommand)]
enum UpdateWhat {
    /// Change a schedule (what is given changes; its windows count from now).
    Schedule {
        domain: String,
        name: String,
        #[command(flatten)]
        spec: ScheduleArgs,
    },
    /// Change a management class's copy groups (unset values stay).
    Mgmtclass {
        domain: String,
        name: String,
        #[command(flatten)]
        groups: CopyGroups,
    },
    /// Move a node to another domain, give it a client option set, or change its password
    /// (--new-password-file, or --password to read it from stdin).
    Node {
        /// The node.
        name: String,
        /// The policy domain to move it to (its associations with the old domain's schedules
        /// end).
        #[arg(long)]
        domain: Option<String>,
        /// The client option set it uses.
        #[arg(long, value_name = "SET")]
        cloptset: Option<String>,
        /// Use no client option set any more.
        #[arg(long, conflicts_with = "cloptset")]
        no_cloptset: bool,
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
        Ok(self.new_password_file.as_deref().map(read_password).transpose()?)
    }
}

#[derive(Debug, Subcommand)]
enum DeleteWhat {
    /// A domain and its classes: refused while nodes belong to it or versions use its classes.
    Domain { name: String },
    /// A management class: refused while versions are bound to it.
    Mgmtclass { domain: String, name: String },
    /// A schedule, its associations and its events.
    Schedule { domain: String, name: String },
    /// Stop a client schedule running for nodes.
    Association {
        /// The schedule's policy domain.
        domain: String,
        /// The client schedule.
        schedule: String,
        /// Nodes it runs for.
        #[arg(required = true)]
        nodes: Vec<String>,
    },
    /// A server defined to replicate to (what it holds stays there).
    Server { name: String },
    /// A client option set and its options (its nodes keep only their own).
    Cloptset { name: String },
    /// Every value of an option of a client option set.
    Clientopt { set: String, option: String },
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
    /// Days every version stored under the class from now on is kept at least, backup or
    /// archive, whoever asks for its deletion (a retention lock; 0: none). Lowering it later
    /// never frees a version already stored.
    #[arg(long)]
    retain_min: Option<u32>,
}

impl CopyGroups {
    fn values(&self) -> qsm_proto::CopyGroups {
        qsm_proto::CopyGroups {
            versions_exist: self.versions_exist,
            versions_deleted: self.versions_deleted,
            retain_extra_days: self.retain_extra,
            retain_only_days: self.retain_only,
            retain_archive_days: self.retain_archive,
            retain_min_days: self.retain_min,
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
    /// Schedules, with their next windows.
    Schedule {
        #[arg(long)]
        json: bool,
    },
    /// The nodes each client schedule runs for.
    Association {
        #[arg(long)]
        json: bool,
    },
    /// Client option sets and their options.
    Cloptset {
        #[arg(long)]
        json: bool,
    },
    /// Holds on nodes and filespaces: administrators' (hold) and the server's on suspect
    /// backups (suspect), with why.
    Hold {
        #[arg(long)]
        json: bool,
    },
    /// The runs of the schedules in their windows (future, started, completed, completed with
    /// warnings, failed, missed, severed), by default of the last 24 hours and the next
    /// windows.
    Event {
        /// Only this node's.
        #[arg(long)]
        node: Option<String>,
        /// Windows starting at this time or later (UTC: "YYYY-MM-DD[ HH:MM]" or @SECONDS).
        #[arg(long, value_parser = qsm_types::time::parse_time)]
        since: Option<i64>,
        #[arg(long)]
        json: bool,
    },
    /// Filespaces of a node, or of every node, each with its last backup (when, its result,
    /// what it stored) and its last completed one.
    Filespace {
        /// Only this node's.
        node: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// A node's backup history: each run of its filespaces (the newest 400 of each), when,
    /// how long, how it ended, what it stored; oldest first.
    Backups {
        node: String,
        /// Only this filespace's.
        #[arg(long)]
        filespace: Option<String>,
        /// Only runs that ended at or after this time (UTC; as `qsm restore --pit` takes it).
        #[arg(long, value_parser = qsm_types::time::parse_time)]
        since: Option<i64>,
        #[arg(long)]
        json: bool,
    },
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
    /// The servers defined to replicate to.
    Server {
        #[arg(long)]
        json: bool,
    },
    /// The activity log: logins, session ends, administrative actions, processes, warnings.
    Actlog {
        /// From this time (UTC; as `qsm restore --pit` takes it; default: the last 24 hours).
        #[arg(long, value_parser = qsm_types::time::parse_time)]
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
enum ReplicateWhat {
    /// Replicate these nodes. Runs as a server process (`query process`, `cancel process`);
    /// a cut or cancelled run is simply run again and sends only what is still missing.
    Node {
        #[arg(required = true)]
        nodes: Vec<String>,
        /// The server to replicate to (default: the only one defined).
        #[arg(long)]
        target: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum RepairWhat {
    /// Fetch each damaged chunk from a version replicated to the server, verify it, write it
    /// anew and point the chunk at it: the versions using it restore again.
    Stgpool {
        /// The replication target holding the copies (default: the only one defined).
        #[arg(long)]
        source: Option<String>,
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
        Some(p) => Ok(read_password(p)?),
        None => password_from_stdin(),
    }
}

/// Refuses (exit 2) what the options alone show cannot work, and reads the new password a
/// command sets, both before the server is reached: a bad password file is named before any
/// connection is tried.
fn before_connecting(command: &AdminCommand) -> Result<Option<String>> {
    let why = match command {
        AdminCommand::RegisterNode(r) if !r.privilege.is_empty() => {
            "--privilege is for administrators: a node has no privilege classes"
        }
        AdminCommand::Update(UpdateWhat::Node {
            domain: None,
            cloptset: None,
            no_cloptset: false,
            password,
            ..
        }) if !password.given() => {
            "say what to change: --domain, --cloptset, --no-cloptset, --new-password-file or \
             --password"
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

pub fn admin(args: AdminArgs) -> Result<bool> {
    if let AdminCommand::MigrateCatalog { from, to, replace, json } = &args.command {
        let migrated = qsm_catalog::copy::migrate(from, to, *replace).map_err(|e| match e {
            qsm_catalog::copy::MigrateError::NotACatalog(why) => crate::usage::usage(why),
            e => e.into(),
        })?;
        emit(&migrated, *json)?;
        return Ok(true);
    }
    let new_password = before_connecting(&args.command)?;
    // Given by `before_connecting` to the commands that set one.
    let new_password = || new_password.clone().context("no new password was read");
    let target = args.conn.open()?;
    // The embedded store's user can read its files, so holds system privilege, as the
    // server's own user does on its local socket.
    let session;
    let admin = Admin(match &target {
        AdminTarget::Remote(r) => r as &dyn AdminApi,
        AdminTarget::Embedded(e) => {
            let uid = rustix::process::geteuid().as_raw();
            session = e.admin(format!("the embedded store's user (uid {uid})"));
            &session
        }
    });
    // Nothing runs the embedded store's schedules: it lives only while a command does.
    if matches!(target, AdminTarget::Embedded(_))
        && matches!(
            args.command,
            AdminCommand::Define(DefineWhat::Schedule { .. })
                | AdminCommand::Update(UpdateWhat::Schedule { .. })
        )
    {
        return Err(crate::usage::usage(
            "the embedded store runs no schedules (it lives only while a qsm command runs, and \
             no scheduler can reach it): define them on a qsm server (--server)",
        ));
    }
    match args.command {
        AdminCommand::RegisterNode(r) => {
            admin.register_node(&r.name, new_password()?)?;
            outln!("Node {} registered.", r.name);
        }
        AdminCommand::RegisterAdmin(r) => {
            admin.register_admin(&r.name, new_password()?, &r.privilege)?;
            outln!(
                "Administrator {} registered with {} privilege.",
                r.name,
                if r.privilege.is_empty() { "no".to_owned() } else { r.privilege.join(",") }
            );
        }
        AdminCommand::LockNode { name } => {
            admin.set_node_locked(&name, true)?;
            outln!("Node {name} locked.");
        }
        AdminCommand::UnlockNode { name } => {
            admin.set_node_locked(&name, false)?;
            outln!("Node {name} unlocked.");
        }
        AdminCommand::LockAdmin { name } => {
            admin.set_admin_locked(&name, true)?;
            outln!("Administrator {name} locked.");
        }
        AdminCommand::UnlockAdmin { name } => {
            admin.set_admin_locked(&name, false)?;
            outln!("Administrator {name} unlocked.");
        }
        AdminCommand::RemoveAdmin { name } => {
            admin.remove_admin(&name)?;
            outln!("Administrator {name} removed.");
        }
        AdminCommand::Cancel { what: CancelWhat::Session { id } } => {
            admin.cancel_session(id)?;
            outln!("Session {id} cancelled.");
        }
        AdminCommand::Cancel { what: CancelWhat::Process { id } } => {
            admin.cancel_process(id)?;
            outln!("Process {id} is stopping.");
        }
        AdminCommand::Hold(HoldWhat::Node { name, filespace, reason }) => {
            admin.hold(&name, filespace.as_deref(), &reason)?;
            match filespace {
                Some(fs) => outln!(
                    "Node {name} filespace {fs} held: none of its versions is deleted until released."
                ),
                None => outln!("Node {name} held: none of its versions is deleted until released."),
            }
        }
        AdminCommand::Release(ReleaseWhat::Node { name, filespace, suspect }) => {
            admin.release(&name, filespace.as_deref(), suspect)?;
            let what = match &filespace {
                Some(fs) => format!("Node {name} filespace {fs}"),
                None => format!("Node {name}"),
            };
            if suspect {
                outln!("{what}: suspect backup acknowledged; its versions may expire again.");
            } else {
                outln!("{what} released.");
            }
        }
        AdminCommand::SetDedupScope { node, scope } => {
            admin.set_dedup_scope(&node, &scope)?;
            outln!("Node {node} deduplicates in scope {scope}.");
        }
        AdminCommand::Define(DefineWhat::Domain { name, description }) => {
            admin.define_domain(&name, &description)?;
            outln!("Domain {name} defined.");
        }
        AdminCommand::Define(DefineWhat::Schedule { domain, name, spec }) => {
            admin.define_schedule(spec.request(domain.clone(), name.clone()))?;
            outln!("Schedule {domain}/{name} defined.");
        }
        AdminCommand::Update(UpdateWhat::Schedule { domain, name, spec }) => {
            admin.update_schedule(spec.request(domain.clone(), name.clone()))?;
            outln!("Schedule {domain}/{name} updated.");
        }
        AdminCommand::Delete(DeleteWhat::Schedule { domain, name }) => {
            admin.delete_schedule(&domain, &name)?;
            outln!("Schedule {domain}/{name} deleted.");
        }
        AdminCommand::Query(AdminQuery::Schedule { json }) => emit(&admin.schedules()?[..], json)?,
        AdminCommand::Define(DefineWhat::Association { domain, schedule, nodes }) => {
            admin.associate(&domain, &schedule, &nodes)?;
            outln!("Schedule {domain}/{schedule} runs for {}.", nodes.join(", "));
        }
        AdminCommand::Delete(DeleteWhat::Association { domain, schedule, nodes }) => {
            admin.dissociate(&domain, &schedule, &nodes)?;
            outln!("Schedule {domain}/{schedule} no longer runs for {}.", nodes.join(", "));
        }
        AdminCommand::Query(AdminQuery::Association { json }) => {
            emit(&admin.associations()?[..], json)?
        }
        AdminCommand::Define(DefineWhat::Cloptset { name, description }) => {
            admin.define_cloptset(&name, &description)?;
            outln!("Client option set {name} defined.");
        }
        AdminCommand::Define(DefineWhat::Clientopt { set, option, value, force }) => {
            admin.define_clientopt(&set, &option, &value, force)?;
            let how = if force { ", forced" } else { "" };
            outln!("Client option set {set}: {option} = {value}{how}.");
        }
        AdminCommand::Delete(DeleteWhat::Cloptset { name }) => {
            admin.delete_cloptset(&name)?;
            outln!("Client option set {name} deleted.");
        }
        AdminCommand::Delete(DeleteWhat::Clientopt { set, option }) => {
            admin.delete_clientopt(&set, &option)?;
            outln!("Client option set {set}: {option} deleted.");
        }
        AdminCommand::Query(AdminQuery::Cloptset { json }) => emit(&admin.cloptsets()?[..], json)?,
        AdminCommand::Query(AdminQuery::Hold { json }) => emit(&admin.holds()?[..], json)?,
        AdminCommand::Query(AdminQuery::Event { node, since, json }) => {
            emit(&admin.events(node.as_deref(), since)?[..], json)?
        }
        AdminCommand::Define(DefineWhat::Mgmtclass { domain, name, groups }) => {
            admin.define_mgmt_class(&domain, &name, &groups.values())?;
            outln!("Management class {domain}/{name} defined.");
        }
        AdminCommand::Update(UpdateWhat::Mgmtclass { domain, name, groups }) => {
            admin.update_mgmt_class(&domain, &name, &groups.values())?;
            outln!("Management class {domain}/{name} updated.");
        }
        AdminCommand::Update(UpdateWhat::Node { name, domain, cloptset, no_cloptset, .. }) => {
            let password = new_password().ok();
            let changes_password = password.is_some();
            let set = if no_cloptset { Some("") } else { cloptset.as_deref() };
            admin.update_node(&name, domain.as_deref(), password, set)?;
            if let Some(domain) = domain {
                outln!("Node {name} is in domain {domain}.");
            }
            match set {
                Some("") => outln!("Node {name} uses no client option set."),
                Some(set) => outln!("Node {name} uses client option set {set}."),
                None => {}
            }
            if changes_password {
                outln!("Node {name} has a new password.");
            }
        }
        AdminCommand::Update(UpdateWhat::Admin { name, .. }) => {
            admin.update_admin(&name, new_password()?)?;
            outln!("Administrator {name} has a new password.");
        }
        AdminCommand::Grant(GrantWhat::Authority { name, privilege }) => {
            admin.grant_authority(&name, &privilege)?;
            outln!("Administrator {name} has {} privilege.", privilege.join(","));
        }
        AdminCommand::Delete(DeleteWhat::Node { name }) => {
            admin.delete_node(&name)?;
            outln!("Node {name} deleted.");
        }
        AdminCommand::Delete(DeleteWhat::Domain { name }) => {
            admin.delete_domain(&name)?;
            outln!("Domain {name} deleted.");
        }
        AdminCommand::Delete(DeleteWhat::Mgmtclass { domain, name }) => {
            admin.delete_mgmt_class(&domain, &name)?;
            outln!("Management class {domain}/{name} deleted.");
        }
        AdminCommand::Delete(DeleteWhat::Filespace { node, filespace, json }) => {
            let report = admin.delete_filespace(&node, &filespace)?;
            emit(&FilespaceDeleted { node: &node, filespace: &filespace, report }, json)?;
        }
        AdminCommand::Query(AdminQuery::Node { json }) => emit(&admin.nodes()?[..], json)?,
        AdminCommand::Query(AdminQuery::Filespace { node, json }) => {
            emit(&admin.filespaces(node.as_deref())?[..], json)?
        }
        AdminCommand::Query(AdminQuery::Backups { node, filespace, since, json }) => {
            emit(&admin.backup_runs(&node, filespace.as_deref(), since.unwrap_or(0))?[..], json)?
        }
        AdminCommand::Query(AdminQuery::Session { json }) => emit(&admin.sessions()?[..], json)?,
        AdminCommand::Query(AdminQuery::Process { json }) => emit(&admin.processes()?[..], json)?,
        AdminCommand::Query(AdminQuery::Domain { json }) => emit(&admin.policy()?[..], json)?,
        AdminCommand::Query(AdminQuery::Stgpool { json }) => emit(&admin.stgpools()?[..], json)?,
        AdminCommand::Query(AdminQuery::Volhist { json }) => emit(&admin.volhist()?[..], json)?,
        AdminCommand::Query(AdminQuery::Actlog { since, search, limit, json }) => {
            let since = since.unwrap_or_else(|| qsm_types::now() - 86_400);
            let log = admin.actlog(since, search, limit)?;
            emit(&log, json)?;
            if log.truncated {
                errln!(
                    "qsm: warning: more entries matched than were returned: narrow --since or --search, or raise --limit"
                );
            }
        }
        AdminCommand::Expire(ExpireWhat::Inventory { resource, node, duration, json }) => {
            emit(&admin.expire_inventory(resource, node, duration)?, json)?;
        }
        AdminCommand::Reclaim(ReclaimWhat::Stgpool { threshold, json }) => {
            emit(&admin.reclaim_stgpool(threshold)?, json)?;
        }
        AdminCommand::Backup(BackupWhat::Db { to, json }) => {
            let to = to.map(|p| p.display().to_string());
            emit(&admin.backup_db(to.as_deref())?, json)?;
        }
        AdminCommand::Audit(AuditWhat::Stgpool {
            mark_damaged,
            release_unknown,
            container,
            json,
        }) => {
            let audit = admin.audit_stgpool(mark_damaged, release_unknown, container)?;
            emit(&audit, json)?;
            if !audit.damaged.is_empty() {
                return Ok(false);
            }
        }
        AdminCommand::Define(DefineWhat::Server {
            name,
            address,
            cert,
            account,
            account_password_file,
        }) => {
            let ca = match &cert {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|e| crate::usage::usage(format!("--cert {}: {e}", path.display())))?,
                None if address.starts_with("https:") => {
                    return Err(crate::usage::usage(
                        "--cert: give the certificate the server's TLS must prove (its \
                         DATA_DIR/tls/cert.pem)",
                    ));
                }
                None => String::new(),
            };
            let password = read_password(&account_password_file)?;
            admin.define_server(&name, &address, &ca, &account, &password)?;
            outln!("Server {name} defined at {address}.");
        }
        AdminCommand::Delete(DeleteWhat::Server { name }) => {
            admin.delete_server(&name)?;
            outln!("Server {name} deleted.");
        }
        AdminCommand::Query(AdminQuery::Server { json }) => emit(&admin.servers()?[..], json)?,
        AdminCommand::Replicate(ReplicateWhat::Node { nodes, target, json }) => {
            let report = admin.replicate_node(nodes, target.as_deref())?;
            emit(&report, json)?;
            if !report.problems.is_empty() {
                return Ok(false);
            }
        }
        AdminCommand::Repair(RepairWhat::Stgpool { source, json }) => {
            let report = admin.repair_stgpool(source.as_deref())?;
            emit(&report, json)?;
            if report.unrepaired > 0 {
                return Ok(false);
            }
        }
        AdminCommand::MigrateCatalog { .. } => unreachable!("handled before connecting"),
    }
    Ok(true)
}

/// `delete filespace`'s report with what it deleted, for the text (the JSON is the report's).
#[derive(serde::Serialize)]
pub(super) struct FilespaceDeleted<'a> {
    #[serde(skip)]
    pub(super) node: &'a str,
    #[serde(skip)]
    pub(super) filespace: &'a str,
    #[serde(flatten)]
    pub(super) report: DeleteFilespaceReport,
}
