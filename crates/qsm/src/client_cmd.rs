//! `qsm backup`, `qsm restore` and `qsm query`, against the embedded server in `$QSM_HOME`.

use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use qsm_client::restore::Existing;
use qsm_client::{BackupOptions, Embedded, RestoreOptions, embedded};
use qsm_codec::Compression;
use serde::Serialize;

/// Whether a command did all it was asked (`false`: some files were skipped).
pub type Complete = bool;

#[derive(Debug, Args)]
pub struct Home {
    /// Where the embedded server keeps its catalog and pool (default: $QSM_HOME, or
    /// ~/.local/share/qsm).
    #[arg(long, global = true)]
    home: Option<PathBuf>,
}

impl Home {
    fn open(&self) -> Result<Embedded> {
        let home = match &self.home {
            Some(h) => h.clone(),
            None => embedded::default_home()?,
        };
        Embedded::open(&home)
            .with_context(|| format!("opening the QSM store in {}", home.display()))
    }
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// Directories or files to back up (incrementally: only what changed is sent).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Compression: auto, off, or CODEC[:LEVEL] (e.g. lz4, zstd:3).
    #[arg(long, default_value = "auto")]
    compression: String,
    /// Worker threads compressing quanta (default: one per core).
    #[arg(short = 'T', long)]
    threads: Option<usize>,
    /// Send every file, changed or not (selective backup).
    #[arg(long)]
    full: bool,
    /// Stay on the file system of each path.
    #[arg(long)]
    one_file_system: bool,
    /// Machine-readable summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    home: Home,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// A backed-up directory or file (its absolute path at backup time, or relative to here).
    path: PathBuf,
    /// Restore into this directory instead of the original location.
    #[arg(long)]
    to: Option<PathBuf>,
    /// Replace files that exist (default: skip them).
    #[arg(long)]
    replace: bool,
    /// Machine-readable summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    home: Home,
}

#[derive(Debug, Subcommand)]
pub enum QueryWhat {
    /// The filespaces backed up.
    Filespace {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        home: Home,
    },
    /// The active backup versions of a filespace (all filespaces when none is named).
    Backup {
        /// A filespace (a backed-up directory).
        filespace: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        home: Home,
    },
}

/// `path` made absolute and cleaned of `.` and `..` without touching the file system (the
/// path may no longer exist when restoring it).
fn absolute(path: &Path) -> Result<PathBuf> {
    let base = if path.is_absolute() { PathBuf::new() } else { std::env::current_dir()? };
    let mut out = PathBuf::new();
    for c in base.join(path).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

pub fn backup(args: BackupArgs) -> Result<Complete> {
    let compression = Compression::parse(&args.compression)?;
    if args.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let embedded = args.home.open()?;
    let options = BackupOptions {
        compression,
        threads: args.threads,
        full: args.full,
        one_file_system: args.one_file_system,
        ..BackupOptions::default()
    };
    let mut complete = true;
    let mut reports = Vec::new();
    for path in &args.paths {
        let s = qsm_client::backup(&embedded.store, embedded.node, path, &options)
            .with_context(|| format!("backing up {}", path.display()))?;
        for w in &s.warnings {
            eprintln!("qsm: warning: {w}");
        }
        complete &= s.failed == 0;
        if !args.json {
            println!("Backup of {}:", s.filespace);
            println!(
                "  examined {}, backed up {}, unchanged {}, failed {}, marked inactive {}",
                s.examined, s.backed_up, s.unchanged, s.failed, s.deactivated
            );
            // Ratio only when something was stored; CPU only over runs long enough for its
            // 10 ms clock ticks to mean something.
            let ratio = if s.bytes_stored > 0 {
                format!("{:.2}:1", s.bytes_read as f64 / s.bytes_stored as f64)
            } else {
                "-".into()
            };
            let cpu = if s.seconds >= 0.5 {
                format!(
                    "{:.0}% ({:.2} s user+sys)",
                    100.0 * s.cpu_seconds / s.seconds,
                    s.cpu_seconds
                )
            } else {
                format!("{:.2} s user+sys", s.cpu_seconds)
            };
            println!(
                "  read {:.1} MB, stored {:.1} MB (ratio {ratio}), {:.2} s, {:.1} MB/s, client CPU {cpu}",
                mb(s.bytes_read),
                mb(s.bytes_stored),
                s.seconds,
                mb(s.bytes_read) / s.seconds.max(1e-9),
            );
        }
        reports.push(BackupReport {
            filespace: s.filespace,
            examined: s.examined,
            backed_up: s.backed_up,
            unchanged: s.unchanged,
            failed: s.failed,
            deactivated: s.deactivated,
            bytes_read: s.bytes_read,
            bytes_stored: s.bytes_stored,
            seconds: s.seconds,
            cpu_seconds: s.cpu_seconds,
            warnings: s.warnings,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    Ok(complete)
}

#[derive(Debug, Serialize)]
struct BackupReport {
    filespace: String,
    examined: u64,
    backed_up: u64,
    unchanged: u64,
    failed: u64,
    deactivated: u64,
    bytes_read: u64,
    bytes_stored: u64,
    seconds: f64,
    cpu_seconds: f64,
    warnings: Vec<String>,
}

pub fn restore(args: RestoreArgs) -> Result<Complete> {
    let embedded = args.home.open()?;
    let wanted = absolute(&args.path)?;
    let wanted_str = wanted.to_str().context("the path is not valid UTF-8")?.to_owned();
    // The filespace is the longest backed-up root that contains the path.
    let filespace = embedded
        .store
        .catalog()
        .filespaces(embedded.node)?
        .into_iter()
        .filter(|f| {
            wanted_str == f.name
                || wanted_str.starts_with(&format!("{}/", f.name.trim_end_matches('/')))
        })
        .max_by_key(|f| f.name.len())
        .with_context(|| {
            format!("nothing backed up contains {wanted_str} (see `qsm query filespace`)")
        })?;
    let sub = wanted_str[filespace.name.len()..].trim_start_matches('/');
    let subpath = (!sub.is_empty()).then(|| sub.as_bytes().to_vec());
    let target = match &args.to {
        Some(t) => absolute(t)?,
        None => PathBuf::from(&filespace.name),
    };
    let options = RestoreOptions {
        subpath,
        existing: if args.replace { Existing::Replace } else { Existing::Skip },
    };
    let s = qsm_client::restore(&embedded.store, embedded.node, &filespace.name, &target, &options)
        .with_context(|| format!("restoring {wanted_str}"))?;
    for w in &s.warnings {
        eprintln!("qsm: warning: {w}");
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({"filespace": filespace.name, "target": target, "restored": s.restored, "skipped": s.skipped, "failed": s.failed, "bytes": s.bytes, "warnings": s.warnings})
        );
    } else {
        println!(
            "Restore of {wanted_str} into {}: restored {}, skipped {} (existing), failed {}, {:.1} MB",
            target.display(),
            s.restored,
            s.skipped,
            s.failed,
            mb(s.bytes)
        );
    }
    Ok(s.failed == 0)
}

#[derive(Debug, Serialize)]
struct VersionRow {
    filespace: String,
    path: String,
    kind: &'static str,
    size: u64,
    mtime_ns: i64,
    mode: u32,
    inserted: i64,
    id: i64,
}

pub fn query(what: QueryWhat) -> Result<Complete> {
    match what {
        QueryWhat::Filespace { json, home } => {
            let e = home.open()?;
            let list = e.store.catalog().filespaces(e.node)?;
            if json {
                let rows: Vec<_> = list
                    .iter()
                    .map(
                        |f| serde_json::json!({"name": f.name, "id": f.id.0, "created": f.created}),
                    )
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for f in list {
                    println!("{}", f.name);
                }
            }
        }
        QueryWhat::Backup { filespace, json, home } => {
            let e = home.open()?;
            let catalog = e.store.catalog();
            let mut rows = Vec::new();
            for f in catalog.filespaces(e.node)? {
                if filespace
                    .as_deref()
                    .is_some_and(|n| n.trim_end_matches('/') != f.name.trim_end_matches('/'))
                {
                    continue;
                }
                catalog.for_each_active(f.id, &mut |v| {
                    rows.push(VersionRow {
                        filespace: f.name.clone(),
                        path: String::from_utf8_lossy(&v.path).into_owned(),
                        kind: match v.object_type {
                            qsm_catalog::ObjectType::File => "file",
                            qsm_catalog::ObjectType::Directory => "dir",
                            qsm_catalog::ObjectType::Symlink => "symlink",
                        },
                        size: v.attrs.size,
                        mtime_ns: v.attrs.mtime_ns,
                        mode: v.attrs.mode,
                        inserted: v.inserted,
                        id: v.id.0,
                    });
                    Ok(())
                })?;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for r in rows {
                    println!("{:<7} {:>12}  {}/{}", r.kind, r.size, r.filespace, r.path);
                }
            }
        }
    }
    Ok(true)
}
