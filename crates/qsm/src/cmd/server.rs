//! `qsm server`: run the server, or work on a stopped server's files.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use qsm_proto::reports::VolhistRow;
use qsm_server::ServerConfig;
use qsm_types::TxnLimits;

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
    /// Serve Prometheus metrics on this address over plain HTTP, at /metrics (e.g.
    /// 127.0.0.1:9300). They name nodes and filespaces: keep it on loopback or a monitoring
    /// network.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_listen: Option<String>,
    /// Serve the web console and its HTTP/JSON API on this address, over HTTPS with the
    /// server's certificate (e.g. 0.0.0.0:1580); administrators log in with their accounts.
    #[arg(long, value_name = "HOST:PORT")]
    http_listen: Option<String>,
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
    set!(socket, catalog, pool, tls_cert, tls_key, metrics_listen, http_listen);
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
                crate::cmd::codec::open_stream(from)
                    .map_err(|e| e.context("--from: not a catalog backup"))?;
            }
            let r = qsm_server::dbcopy::restore(&config, from.as_deref())
                .map_err(anyhow::Error::msg)?;
            outln!(
                "Catalog restored from {}{}: {} object versions.",
                r.from.display(),
                r.taken
                    .map(|t| format!(" (taken {})", qsm_types::time::format_time(t)))
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
            let rows: Vec<VolhistRow> = entries.into_iter().map(VolhistRow::from).collect();
            crate::render::emit(&rows[..], json)?;
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
        if let Some(metrics) = &l.metrics {
            let _ = writeln!(out, "qsm server: metrics on {metrics}");
        }
        if let Some(console) = &l.console {
            let _ = writeln!(out, "qsm server: web console and API on {console}");
        }
        let _ = out.flush();
    })?;
    Ok(true)
}
