//! `qsm sched`: the client scheduler, a long-running process (for systemd:
//! `contrib/qsm-sched.service`) that runs the node's scheduled backups and archives in their
//! windows ([`qsm_client::sched`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use qsm_client::remote::RemoteServer;
use qsm_client::sched::{Link, SchedOptions};
use qsm_client::server::Server;

use crate::conn::Conn;

use super::Complete;

#[derive(Debug, Args)]
pub struct SchedArgs {
    /// How often the server is asked for the node's schedules while nothing is due sooner
    /// (a schedule defined or changed meanwhile is seen within this): 30s, 5m.
    #[arg(long, default_value = "60s", value_parser = crate::usage::seconds)]
    poll: i64,
    /// Percent of each window, from its start, over which the node picks its moment at random,
    /// so a fleet does not start at once (TSM's RANDOMIZE).
    #[arg(long, default_value_t = 25, value_parser = crate::usage::range(0u32, 100, "percent"))]
    spread: u32,
    #[command(flatten)]
    home: Conn,
}

/// The scheduler's connection, made again after a loss (to the next server of several).
struct Remote<'a> {
    conn: &'a Conn,
    servers: Vec<String>,
    which: usize,
    remote: Option<RemoteServer>,
}

impl Link for Remote<'_> {
    fn server(&mut self) -> qsm_client::Result<&dyn Server> {
        if self.remote.is_none() {
            self.remote = Some(self.conn.reach().connect(&self.servers, &mut self.which)?);
        }
        match &self.remote {
            Some(r) => Ok(r),
            None => Err(qsm_client::ClientError::Usage("not connected".into())),
        }
    }

    fn lost(&mut self) {
        if self.remote.take().is_some() {
            self.which += 1;
        }
    }
}

pub fn sched(args: SchedArgs) -> Result<Complete> {
    let config = args.home.config()?;
    let servers = args.home.servers()?;
    if servers.is_empty() {
        return Err(crate::usage::usage(
            "qsm sched runs a server's schedules: give --server (or QSM_SERVER, or server in \
             client.toml); the embedded store has none",
        ));
    }
    let node = args.home.reach().node.or(config.node.clone()).unwrap_or_default();
    let state = qsm_client::config::state_dir()
        .context("no $HOME or $XDG_STATE_HOME to keep the scheduler's lock in")?;
    let options = SchedOptions {
        poll: Duration::from_secs(args.poll.max(1) as u64),
        spread: f64::from(args.spread) / 100.0,
        pre_command: config.pre_command.clone(),
        post_command: config.post_command.clone(),
        program: std::env::current_exe().context("finding the qsm binary to run actions with")?,
        conn_args: args.home.args(),
        lock: state.join(format!("sched-{node}.lock")),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("watching for SIGINT and SIGTERM")?;
    }
    let lock = qsm_client::sched::take_lock(&options.lock)?;
    let mut link = Remote { conn: &args.home, servers, which: 0, remote: None };
    outln!("qsm sched: node {node}, asking {} every {} s", link.servers.join(","), args.poll);
    qsm_client::sched::run(&mut link, &options, lock, &stop, &mut |line| {
        let now = qsm_types::time::format_time(qsm_types::now());
        outln!("{now} {line}");
    })?;
    outln!("qsm sched: stopped");
    Ok(true)
}
