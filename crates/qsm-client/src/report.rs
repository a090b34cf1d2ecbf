//! What client operations report, as values a front end renders: `qsm` writes each as text
//! or (`--json`) as it serializes here, so the two show the same figures. A name that is not
//! valid UTF-8 is given as text with U+FFFD and, exactly, in hex ([`name_json`]).

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use qsm_types::model::{ObjectKind, ObjectVersion};
use serde::Serialize;

use crate::backup::BackupSummary;
use crate::error::{ClientError, Result};
use crate::restore::RestoreSummary;
use crate::server::{Scope, Server};

/// What the expiration after an embedded backup deleted.
#[derive(Debug, Clone, Serialize)]
pub struct ExpiredReport {
    pub backups: u64,
    pub archives: u64,
    pub seconds: f64,
}

/// A backup's or an archive's summary.
#[derive(Debug, Clone, Serialize)]
pub struct BackupReport {
    pub filespace: String,
    /// What expiration deleted after the backup (the embedded store; on the last report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expired: Option<ExpiredReport>,
    /// The path backed up below the filespace's root, when it is not the root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subtree: Option<String>,
    pub examined: u64,
    pub backed_up: u64,
    pub unchanged: u64,
    pub failed: u64,
    /// Sockets, which QSM does not back up (named in `warnings`).
    pub skipped: u64,
    /// Reads of files that changed while read, read again.
    pub retried: u64,
    /// Unchanged files sent again to be sealed with this backup's key.
    pub resealed: u64,
    pub deactivated: u64,
    pub bytes_read: u64,
    pub bytes_stored: u64,
    pub seconds: f64,
    pub cpu_seconds: f64,
    pub chunks: u64,
    pub dedup_chunks: u64,
    pub dedup_bytes: u64,
    pub cache_hits: u64,
    pub asked: u64,
    pub encrypted_bytes: u64,
    pub encrypt_seconds: f64,
    pub key_fingerprint: Option<String>,
    /// The options the server's client option set gave (`name=value`, ` (forced)` when it
    /// overrode the node's own).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub server_options: Vec<String>,
    pub journal: Option<String>,
    pub journal_used: bool,
    /// "network-bound at 9.8 Mbit/s: zstd:9 on 71% of quanta, ...".
    pub compression: String,
    pub compression_mix: Vec<CompressionUse>,
    /// read, cpu, network, server or pool (the embedded store's disk; adaptive compression
    /// only).
    pub bottleneck: Option<&'static str>,
    /// Frame bytes per second of the server's storing time, as a remote server reported it
    /// (adaptive compression only).
    pub server_store_rate: Option<u64>,
    pub warnings: Vec<String>,
    /// Why the dedup cache was not used (text only).
    #[serde(skip)]
    pub cache_note: Option<String>,
    /// The journal line says what every backup of the tree says (text only, with --verbose).
    #[serde(skip)]
    pub journal_routine: bool,
}

/// How many quanta one compression setting took.
#[derive(Debug, Clone, Serialize)]
pub struct CompressionUse {
    pub setting: String,
    pub quanta: u64,
    pub raw_quanta: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl From<&BackupSummary> for BackupReport {
    fn from(s: &BackupSummary) -> Self {
        BackupReport {
            filespace: s.filespace.clone(),
            expired: None,
            subtree: s.subtree.as_deref().map(|p| String::from_utf8_lossy(p).into_owned()),
            examined: s.examined,
            backed_up: s.backed_up,
            unchanged: s.unchanged,
            failed: s.failed,
            skipped: s.skipped,
            retried: s.retried,
            resealed: s.resealed,
            deactivated: s.deactivated,
            bytes_read: s.bytes_read,
            bytes_stored: s.bytes_stored,
            seconds: s.seconds,
            cpu_seconds: s.cpu_seconds,
            chunks: s.chunks,
            dedup_chunks: s.dedup_chunks,
            dedup_bytes: s.dedup_bytes,
            cache_hits: s.cache_hits,
            asked: s.asked,
            encrypted_bytes: s.encrypted_bytes,
            encrypt_seconds: s.encrypt_seconds,
            key_fingerprint: s.key_fingerprint.clone(),
            server_options: Vec::new(),
            journal: s.journal.clone(),
            journal_used: s.journal_used,
            compression: s.compression.describe(),
            compression_mix: s
                .compression
                .rungs
                .iter()
                .filter(|r| r.quanta > 0)
                .map(|r| CompressionUse {
                    setting: r.setting.clone(),
                    quanta: r.quanta,
                    raw_quanta: r.raw_quanta,
                    bytes_in: r.bytes_in,
                    bytes_out: r.bytes_out,
                })
                .collect(),
            bottleneck: s.compression.bottleneck.map(|b| b.name()),
            server_store_rate: s.compression.server_rate.map(|r| r.round() as u64),
            warnings: s.warnings.clone(),
            cache_note: s.cache_note.clone(),
            journal_routine: s.journal_routine,
        }
    }
}

/// A name as `--json` gives it: the text, and, only when the name is not valid UTF-8, its
/// exact bytes in lowercase hex. The text of such a name replaces each invalid sequence with
/// U+FFFD, so two names can print alike: the hex tells them apart (README, "Output for
/// scripts").
pub fn name_json(bytes: &[u8]) -> (String, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), None),
        Err(_) => (
            String::from_utf8_lossy(bytes).into_owned(),
            Some(bytes.iter().map(|b| format!("{b:02x}")).collect()),
        ),
    }
}

/// `path` made absolute and cleaned of `.` and `..` without touching the file system (the
/// path may no longer exist when restoring it).
pub fn absolute(path: &Path) -> Result<PathBuf> {
    let base = if path.is_absolute() {
        PathBuf::new()
    } else {
        std::env::current_dir().map_err(ClientError::io("finding", "the current directory"))?
    };
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

/// The filespace containing `path`, and the path below it. Compared as bytes: a path need not
/// be valid UTF-8 (filespace names are; the names below them may be anything).
pub fn locate(server: &dyn Server, path: &Path) -> Result<(String, Option<Vec<u8>>)> {
    let wanted = absolute(path)?;
    let bytes = wanted.as_os_str().as_bytes();
    // The filespace is the longest backed-up root that contains the path.
    let filespace = server
        .filespaces()?
        .into_iter()
        .filter(|f| {
            let root = f.name.trim_end_matches('/').as_bytes();
            bytes == f.name.as_bytes()
                || (bytes.starts_with(root) && bytes.get(root.len()) == Some(&b'/'))
        })
        .max_by_key(|f| f.name.len())
        .ok_or_else(|| {
            ClientError::Invalid(format!(
                "nothing backed up or archived contains {} (see `qsm query filespace`)",
                wanted.display()
            ))
        })?;
    let sub = bytes.get(filespace.name.len()..).unwrap_or_default();
    let sub = &sub[sub.iter().take_while(|&&b| b == b'/').count()..];
    Ok((filespace.name.clone(), (!sub.is_empty()).then(|| sub.to_vec())))
}

/// One version, as `qsm query backup` and `qsm query archive` list it.
#[derive(Debug, Clone, Serialize)]
pub struct VersionRow {
    pub filespace: String,
    /// The path below the filespace; not valid UTF-8, with U+FFFD, and exact in `path_hex`.
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
    /// "active", "inactive" or "archive".
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub kind: &'static str,
    pub size: u64,
    pub mtime_ns: i64,
    pub mode: u32,
    pub inserted: i64,
    pub id: i64,
    /// The archive (one `qsm archive` run) the version belongs to: the id of its first
    /// object, for `qsm retrieve --id` (see qsm_client::archives).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive: Option<i64>,
    /// When that archive's first transaction committed (seconds since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archived: Option<i64>,
}

/// The versions `keep` keeps of every filespace, or with `path` of the filespace holding it
/// at or below it; with `archives`, each archive version with the archive it belongs to.
pub fn versions(
    server: &dyn Server,
    path: Option<&Path>,
    archives: bool,
    keep: &dyn Fn(&ObjectVersion) -> bool,
) -> Result<Vec<VersionRow>> {
    let mut rows = Vec::new();
    // A path: the filespace holding it, and only what is at or below it there.
    let wanted = path.map(|p| locate(server, p)).transpose()?;
    let sub = wanted.as_ref().and_then(|(_, sub)| sub.clone()).unwrap_or_default();
    let within = |p: &[u8]| crate::scan::within(p, &sub);
    for f in server.filespaces()? {
        if wanted.as_ref().is_some_and(|(name, _)| *name != f.name) {
            continue;
        }
        // One pass over the inventory: the versions listed, and (for archives) every archive
        // version, to tell which archive each belongs to and its date.
        let (mut listed, mut archived) = (Vec::new(), Vec::new());
        server.inventory(f.id, Scope::All, &mut |mut v| {
            v.chunks = Vec::new();
            if archives && v.kind == ObjectKind::Archive {
                archived.push(v.clone());
            }
            if keep(&v) && within(&v.path) {
                listed.push(v);
            }
            Ok(())
        })?;
        let mut archive_of = std::collections::HashMap::new();
        for (a, _) in crate::archives::group(archived) {
            for o in &a.objects {
                archive_of.insert(*o, (a.id.0, a.date));
            }
        }
        for v in listed {
            let (path, path_hex) = name_json(&v.path);
            rows.push(VersionRow {
                filespace: f.name.clone(),
                path,
                path_hex,
                state: match (v.kind, v.active) {
                    (ObjectKind::Archive, _) => "archive",
                    (_, true) => "active",
                    _ => "inactive",
                },
                description: v.description.clone(),
                kind: v.object_type.name(),
                size: v.attrs.size,
                mtime_ns: v.attrs.mtime_ns,
                mode: v.attrs.mode,
                inserted: v.inserted,
                id: v.id.0,
                archive: archive_of.get(&v.id).map(|a| a.0),
                archived: archive_of.get(&v.id).map(|a| a.1),
            });
        }
    }
    Ok(rows)
}

/// A name as `--json` gives it: the text, and the exact bytes only when they are not UTF-8.
#[derive(Debug, Clone, Serialize)]
pub struct NameJson {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
}

impl NameJson {
    pub fn new(bytes: &[u8]) -> NameJson {
        let (path, path_hex) = name_json(bytes);
        NameJson { path, path_hex }
    }
}

/// A restore's or a retrieve's summary.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    pub filespace: String,
    /// Where it was restored to.
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_hex: Option<String>,
    /// Entries restored: files, directories, links.
    pub restored: u64,
    /// Restored beside existing files, as NAME.restored.
    pub renamed: u64,
    /// Existing files left alone.
    pub skipped: u64,
    pub failed: u64,
    pub bytes: u64,
    /// Temporary files of interrupted restores removed.
    pub leftovers_removed: u64,
    /// Restored without some of their metadata.
    pub incomplete: u64,
    pub warnings: Vec<String>,
    pub seconds: f64,
    pub bytes_per_second: f64,
    pub entries_per_second: f64,
    pub failed_paths: Vec<NameJson>,
}

impl RestoreReport {
    /// The report of `s`, which restored `filespace` into `target` in `seconds`.
    pub fn new(s: &RestoreSummary, filespace: &str, target: &Path, seconds: f64) -> RestoreReport {
        let per_second = |n: f64| n / seconds.max(1e-6);
        let (target_text, target_hex) = name_json(target.as_os_str().as_bytes());
        RestoreReport {
            filespace: filespace.to_owned(),
            target: target_text,
            target_hex,
            restored: s.restored,
            renamed: s.renamed,
            skipped: s.skipped,
            failed: s.failed,
            bytes: s.bytes,
            leftovers_removed: s.leftovers,
            incomplete: s.incomplete,
            warnings: s.warnings.clone(),
            seconds,
            bytes_per_second: per_second(s.bytes as f64),
            // Entries restored per second: files, directories and links alike (issue 24).
            entries_per_second: per_second(s.restored as f64),
            failed_paths: s.failed_paths.iter().map(|p| NameJson::new(p)).collect(),
        }
    }
}

/// An archive run's summary.
#[derive(Debug, Clone, Serialize)]
pub struct ArchiveReport {
    pub filespace: String,
    /// The path archived below the filespace's root, when it is not the root (text only).
    #[serde(skip)]
    pub subtree: Option<String>,
    pub description: String,
    /// Days the archive is kept ([`qsm_types::model::NO_LIMIT`]: without limit).
    pub retain_days: u32,
    pub objects: u64,
    pub bytes_read: u64,
    pub bytes_stored: u64,
    pub failed: u64,
    pub warnings: Vec<String>,
}

impl ArchiveReport {
    pub fn new(s: &BackupSummary, description: &str, retain_days: u32) -> ArchiveReport {
        ArchiveReport {
            filespace: s.filespace.clone(),
            subtree: s.subtree.as_deref().map(|p| String::from_utf8_lossy(p).into_owned()),
            description: description.to_owned(),
            retain_days,
            objects: s.backed_up,
            bytes_read: s.bytes_read,
            bytes_stored: s.bytes_stored,
            failed: s.failed,
            warnings: s.warnings.clone(),
        }
    }
}

pub use qsm_proto::reports::{FilespaceRow, RunRow};

/// Every filespace of the node.
pub fn filespaces(server: &dyn Server) -> Result<Vec<FilespaceRow>> {
    Ok(server.filespaces()?.iter().map(|f| FilespaceRow::new(String::new(), f)).collect())
}

/// One entry a restore would write (`qsm restore --dry-run`).
#[derive(Debug, Clone, Serialize)]
pub struct PlannedRow {
    #[serde(flatten)]
    pub name: NameJson,
    /// "file", "directory", "symlink", ...
    pub kind: &'static str,
    /// Bytes of data (files).
    pub size: u64,
    pub id: i64,
}

/// What a restore would write, nothing written (`qsm restore --dry-run`).
#[derive(Debug, Clone, Serialize)]
pub struct RestorePlan {
    pub filespace: String,
    pub target: String,
    pub entries: Vec<PlannedRow>,
    /// Entries, and bytes of file data.
    pub count: u64,
    pub bytes: u64,
}

impl RestorePlan {
    /// The plan of `selected`, a restore of `filespace` into `target`.
    pub fn new(selected: &crate::restore::Selected, filespace: &str, target: &Path) -> RestorePlan {
        let entries: Vec<PlannedRow> = selected
            .versions
            .iter()
            .filter(|v| !selected.ancestors.contains(&v.id))
            .map(|v| PlannedRow {
                name: NameJson::new(&v.path),
                kind: v.object_type.name(),
                size: if v.object_type == qsm_types::model::ObjectType::File {
                    v.attrs.size
                } else {
                    0
                },
                id: v.id.0,
            })
            .collect();
        RestorePlan {
            filespace: filespace.to_owned(),
            target: name_json(target.as_os_str().as_bytes()).0,
            count: entries.len() as u64,
            bytes: entries.iter().map(|e| e.size).sum(),
            entries,
        }
    }
}
