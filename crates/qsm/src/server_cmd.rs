//! `qsm server` and `qsm admin`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use qsm_client::remote::{self, RemoteOptions, RemoteServer};
use qsm_proto::v1;
use qsm_server::ServerConfig;

use crate::conn::read_password;

/// `qsm server`: every setting of the configuration file is also a flag, which wins.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// The configuration file (TOML; see docs/ADMIN.md for every setting).
    #[arg(long, short = 'c', env = "QSM_SERVER_CONFIG")]
    config: Option<PathBuf>,
    /// Where catalog, pool, certificate and socket live unless placed elsewhere.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A TCP address to listen on (repeatable; port 0 picks one). Default 0.0.0.0:1500.
    #[arg(long)]
    listen: Vec<String>,
    /// No TCP listener: the local socket only.
    #[arg(long, conflicts_with = "listen")]
    no_tcp: bool,
    /// Serve TCP without TLS (tests, or a link that is already private).
    #[arg(long)]
    plaintext: bool,
    /// The local socket (default DATA_DIR/qsm.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The catalog database (put it on an SSD).
    #[arg(long)]
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
    #[arg(long)]
    txn_group_max: Option<usize>,
    /// Frame bytes per transaction at most (TXNBYTELIMIT).
    #[arg(long)]
    txn_byte_limit: Option<u64>,
    /// Sessions open at once at most.
    #[arg(long)]
    max_sessions: Option<usize>,
    /// Clients deduplicate by default (their `--dedup` flag or `dedup` setting wins).
    #[arg(long)]
    dedup: bool,
}

pub fn server(args: ServerArgs) -> Result<bool> {
    let mut config = match &args.config {
        Some(p) => ServerConfig::load(p).map_err(anyhow::Error::msg)?,
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
    config.validate().map_err(anyhow::Error::msg)?;
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
    /// root), or https://HOST:PORT with --admin and --password-file.
    #[arg(long, global = true, env = "QSM_SERVER")]
    server: Option<String>,
    /// The administrator to log in as (not needed on the local socket).
    #[arg(long, global = true, env = "QSM_ADMIN")]
    admin: Option<String>,
    /// A file whose first line is the administrator's password.
    #[arg(long, global = true, env = "QSM_PASSWORD_FILE")]
    password_file: Option<PathBuf>,
    /// The server certificate to trust.
    #[arg(long, global = true, env = "QSM_CA")]
    ca: Option<PathBuf>,
}

impl AdminConn {
    fn open(&self) -> Result<RemoteServer> {
        let url = self.server.clone().context("say which server: --server or QSM_SERVER")?;
        match &self.admin {
            None if url.starts_with("unix:") => Ok(remote::connect_local_admin(&url)?),
            None => {
                bail!("give --admin NAME and --password-file, or use the server's unix: socket")
            }
            Some(name) => {
                let file = self.password_file.as_ref().context("--admin needs --password-file")?;
                Ok(RemoteServer::connect(&RemoteOptions {
                    url,
                    account: name.clone(),
                    password: read_password(file)?,
                    admin: true,
                    ca: self.ca.clone(),
                })?)
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
    /// List nodes or sessions.
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
    /// Delete a domain or a management class (refused while in use).
    #[command(subcommand)]
    Delete(DeleteWhat),
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
    /// Move a node to another domain.
    Node {
        name: String,
        #[arg(long)]
        domain: String,
    },
}

#[derive(Debug, Subcommand)]
enum DeleteWhat {
    /// A domain and its classes: refused while nodes belong to it or versions use its classes.
    Domain { name: String },
    /// A management class: refused while versions are bound to it.
    Mgmtclass { domain: String, name: String },
}

/// Copy-group values: a count or number of days, or `nolimit`.
#[derive(Debug, Args)]
struct CopyGroups {
    /// Versions kept while the file exists, the active one included.
    #[arg(long, value_parser = limit, allow_negative_numbers = true)]
    versions_exist: Option<u32>,
    /// Inactive versions kept after the file was deleted.
    #[arg(long, value_parser = limit, allow_negative_numbers = true)]
    versions_deleted: Option<u32>,
    /// Days an inactive version is kept (but the last of a deleted file).
    #[arg(long, value_parser = limit, allow_negative_numbers = true)]
    retain_extra: Option<u32>,
    /// Days the last inactive version of a deleted file is kept.
    #[arg(long, value_parser = limit, allow_negative_numbers = true)]
    retain_only: Option<u32>,
    /// Days an archive is kept.
    #[arg(long, value_parser = limit, allow_negative_numbers = true)]
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

/// A count or number of days, or `nolimit` (TSM's NOLIMIT).
fn limit(text: &str) -> std::result::Result<u32, String> {
    if text.eq_ignore_ascii_case("nolimit") {
        return Ok(qsm_catalog::expire::NO_LIMIT);
    }
    match text.parse::<u32>() {
        Ok(n) if n < qsm_catalog::expire::NO_LIMIT => Ok(n),
        _ => Err(format!(
            "{text:?} is not a number of versions or days: give 0 to {}, or nolimit",
            qsm_catalog::expire::NO_LIMIT - 1
        )),
    }
}

#[derive(Debug, Subcommand)]
enum ReclaimWhat {
    /// Copy the live frames of containers at least PCT% reclaimable into new containers and
    /// delete the old ones (and containers no catalog record names). Runs as a server process
    /// (`query process`, `cancel process`).
    Stgpool {
        /// Reclaimable share of a container that makes it worth rewriting (TSM's RECLAIM=).
        #[arg(long, default_value_t = 60)]
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
        #[arg(long, default_value_t = 4)]
        resource: u32,
        /// Only this node (repeatable).
        #[arg(long)]
        node: Vec<String>,
        /// Stop after this many minutes.
        #[arg(long)]
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
    /// The activity log: logins, session ends, administrative actions, processes, warnings.
    Actlog {
        /// From this time (UTC; as `qsm restore --pit` takes it; default: the last 24 hours).
        #[arg(long, value_parser = crate::client_cmd::parse_time)]
        since: Option<i64>,
        /// Only entries containing this text (case-insensitive).
        #[arg(long)]
        search: Option<String>,
        /// At most this many entries, the newest.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
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
        None => {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).context("reading the password from stdin")?;
            Ok(line.trim_end_matches(['\n', '\r']).to_owned())
        }
    }
}

pub fn admin(args: AdminArgs) -> Result<bool> {
    let server = args.conn.open()?;
    match args.command {
        AdminCommand::RegisterNode(r) => {
            let password = new_password(&r)?;
            let mut a = server.admin();
            server.call(a.register_node(v1::RegisterRequest { name: r.name.clone(), password }))?;
            println!("Node {} registered.", r.name);
        }
        AdminCommand::RegisterAdmin(r) => {
            let password = new_password(&r)?;
            let mut a = server.admin();
            server
                .call(a.register_admin(v1::RegisterRequest { name: r.name.clone(), password }))?;
            println!("Administrator {} registered.", r.name);
        }
        AdminCommand::LockNode { name } => {
            let mut a = server.admin();
            server.call(a.set_node_locked(v1::LockRequest { name: name.clone(), locked: true }))?;
            println!("Node {name} locked.");
        }
        AdminCommand::UnlockNode { name } => {
            let mut a = server.admin();
            server
                .call(a.set_node_locked(v1::LockRequest { name: name.clone(), locked: false }))?;
            println!("Node {name} unlocked.");
        }
        AdminCommand::Query(AdminQuery::Node { json }) => {
            let mut a = server.admin();
            let nodes = server.call(a.query_nodes(v1::Empty {}))?.nodes;
            if json {
                let rows: Vec<_> = nodes
                    .iter()
                    .map(|n| serde_json::json!({"name": n.name, "locked": n.locked, "registered": n.registered}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for n in nodes {
                    println!("{:<24} {}", n.name, if n.locked { "locked" } else { "" });
                }
            }
        }
        AdminCommand::Query(AdminQuery::Session { json }) => {
            let mut a = server.admin();
            let sessions = server.call(a.query_sessions(v1::Empty {}))?.sessions;
            let now = qsm_catalog::now();
            let rate = |s: &v1::SessionInfo| s.bytes as f64 / (now - s.started).max(1) as f64;
            if json {
                let rows: Vec<_> = sessions
                    .iter()
                    .map(|s| serde_json::json!({"id": s.id, "account": s.account, "admin": s.admin, "client": s.client, "peer": s.peer, "started": s.started, "bytes": s.bytes, "objects": s.objects, "bytes_per_second": rate(s), "state": s.state}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:>6}  {:<16} {:<9} {:>12} {:>9} {:>10}  {:<24} client",
                    "id", "account", "state", "bytes", "objects", "MB/s", "peer"
                );
                for s in &sessions {
                    println!(
                        "{:>6}  {:<16} {:<9} {:>12} {:>9} {:>10.2}  {:<24} {}",
                        s.id,
                        if s.admin { format!("{} (admin)", s.account) } else { s.account.clone() },
                        s.state,
                        s.bytes,
                        s.objects,
                        rate(s) / 1e6,
                        s.peer,
                        s.client
                    );
                }
            }
        }
        AdminCommand::Cancel { what: CancelWhat::Session { id } } => {
            let mut a = server.admin();
            server.call(a.cancel_session(v1::CancelRequest { session: id }))?;
            println!("Session {id} cancelled.");
        }
        AdminCommand::SetDedupScope { node, scope } => {
            let mut a = server.admin();
            server.call(a.set_dedup_scope(v1::DedupScopeRequest {
                node: node.clone(),
                scope: scope.clone(),
            }))?;
            println!("Node {node} deduplicates in scope {scope}.");
        }
        AdminCommand::Expire(ExpireWhat::Inventory { resource, node, duration, json }) => {
            if resource == 0 {
                bail!("--resource must be at least 1");
            }
            let mut a = server.admin();
            let r = server.call(a.expire_inventory(v1::ExpireRequest {
                resource,
                nodes: node,
                duration_minutes: duration.unwrap_or(0),
            }))?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"process": r.process, "examined": r.examined, "backups": r.backups, "archives": r.archives, "filespaces": r.filespaces, "stopped": (!r.stopped.is_empty()).then_some(&r.stopped), "seconds": r.seconds})
                );
            } else {
                println!(
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
            let mut a = server.admin();
            let list = server.call(a.query_processes(v1::Empty {}))?.processes;
            if json {
                let rows: Vec<_> = list
                    .iter()
                    .map(|p| serde_json::json!({"id": p.id, "kind": p.kind, "started": p.started, "progress": p.progress}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for p in &list {
                    println!("{:>6}  {:<18} {}", p.id, p.kind, p.progress);
                }
            }
        }
        AdminCommand::Define(DefineWhat::Domain { name, description }) => {
            let mut a = server.admin();
            server.call(a.define_domain(v1::DomainRequest { name: name.clone(), description }))?;
            println!("Domain {name} defined.");
        }
        AdminCommand::Define(DefineWhat::Mgmtclass { domain, name, groups }) => {
            let mut a = server.admin();
            server.call(a.define_mgmt_class(groups.request(&domain, &name)))?;
            println!("Management class {domain}/{name} defined.");
        }
        AdminCommand::Update(UpdateWhat::Mgmtclass { domain, name, groups }) => {
            let mut a = server.admin();
            server.call(a.update_mgmt_class(groups.request(&domain, &name)))?;
            println!("Management class {domain}/{name} updated.");
        }
        AdminCommand::Update(UpdateWhat::Node { name, domain }) => {
            let mut a = server.admin();
            server.call(a.update_node(v1::UpdateNodeRequest {
                name: name.clone(),
                domain: domain.clone(),
            }))?;
            println!("Node {name} is in domain {domain}.");
        }
        AdminCommand::Delete(DeleteWhat::Domain { name }) => {
            let mut a = server.admin();
            server.call(a.delete_domain(v1::DomainRequest {
                name: name.clone(),
                description: String::new(),
            }))?;
            println!("Domain {name} deleted.");
        }
        AdminCommand::Delete(DeleteWhat::Mgmtclass { domain, name }) => {
            let mut a = server.admin();
            let request = v1::MgmtClassRequest {
                domain: domain.clone(),
                name: name.clone(),
                ..Default::default()
            };
            server.call(a.delete_mgmt_class(request))?;
            println!("Management class {domain}/{name} deleted.");
        }
        AdminCommand::Query(AdminQuery::Domain { json }) => {
            let mut a = server.admin();
            let list = server.call(a.query_policy(v1::Empty {}))?.domains;
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
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for d in &list {
                    println!("{}  ({} nodes) {}", d.name, d.nodes.len(), d.description);
                    for c in &d.classes {
                        println!(
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
            if !(1..=100).contains(&threshold) {
                bail!("--threshold is a percentage, 1 to 100");
            }
            let mut a = server.admin();
            let r = server
                .call(a.reclaim_stgpool(v1::ReclaimRequest { threshold_percent: threshold }))?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"process": r.process, "containers": r.containers, "orphans": r.orphans, "stopped": (!r.stopped.is_empty()).then_some(&r.stopped), "seconds": r.seconds})
                );
            } else {
                println!(
                    "Process {}: reclaim stgpool {}: {} containers reclaimed, {} orphan containers removed, {:.1} s.",
                    r.process,
                    if r.stopped.is_empty() { "ended" } else { r.stopped.as_str() },
                    r.containers,
                    r.orphans,
                    r.seconds
                );
            }
        }
        AdminCommand::Query(AdminQuery::Actlog { since, search, limit, json }) => {
            let mut a = server.admin();
            let since = since.unwrap_or_else(|| qsm_catalog::now() - 86_400);
            let r = server.call(a.query_actlog(v1::ActlogRequest {
                since,
                search: search.unwrap_or_default(),
                limit,
            }))?;
            if json {
                let rows: Vec<_> = r
                    .entries
                    .iter()
                    .map(|e| serde_json::json!({"time": e.time, "severity": e.severity, "message": e.message}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for e in &r.entries {
                    println!(
                        "{}  {:<7}  {}",
                        crate::client_cmd::format_time(e.time),
                        e.severity,
                        e.message
                    );
                }
            }
            if r.truncated {
                eprintln!(
                    "qsm: warning: more entries matched than were returned: narrow --since or --search, or raise --limit"
                );
            }
        }
        AdminCommand::Cancel { what: CancelWhat::Process { id } } => {
            let mut a = server.admin();
            server.call(a.cancel_process(v1::ProcessRequest { process: id }))?;
            println!("Process {id} is stopping.");
        }
    }
    Ok(true)
}
