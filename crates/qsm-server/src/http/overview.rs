//! The console's overview: which nodes are protected, at risk or failed, and what the pool
//! and catalog hold, made from the core's queries (as `qsm admin query` reads them) and the
//! catalog's counts. The counts read whole tables, so the figures are kept a few seconds:
//! many consoles open cost one reading.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use qsm_proto::reports::FilespaceRow;
use qsm_types::ServerError;
use qsm_types::model::RunResult;
use serde::Serialize;

use crate::node_core::catalog_error;
use crate::state::State;

/// How long a reading of the overview is served again.
const KEPT_FOR: Duration = Duration::from_secs(5);
/// A node is protected when each of its filespaces completed a backup this recently.
pub const PROTECTED_WITHIN: i64 = 86_400;

/// The last reading.
#[derive(Debug, Default)]
pub struct Kept(Mutex<Option<(Instant, Overview)>>);

/// Nodes by their state.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct NodeCounts {
    pub total: u64,
    /// Every filespace completed a backup in the last 24 hours.
    pub protected: u64,
    /// A filespace's last completed backup is older than 24 hours.
    pub at_risk: u64,
    /// A backup in the last 24 hours failed and none completed since.
    pub failed: u64,
    /// No backup completed ever.
    pub never: u64,
}

/// One node's state.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct NodeStatus {
    pub name: String,
    /// "protected", "at risk", "failed" or "never backed up".
    pub status: &'static str,
    pub locked: bool,
    /// When the oldest of its filespaces' last completed backups ended: how old its
    /// protection is.
    pub last_completed: Option<i64>,
    /// How its latest backup ended.
    pub last_result: Option<&'static str>,
    pub filespaces: u64,
}

/// The storage pools together.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct PoolUse {
    pub containers: u64,
    pub bytes: u64,
    /// Bytes of chunks versions use.
    pub live_bytes: u64,
    /// Bytes reclamation could free.
    pub reclaimable_bytes: u64,
    pub damaged_chunks: u64,
}

/// The catalog's size.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct CatalogUse {
    pub database_bytes: u64,
    /// Object versions.
    pub objects: u64,
    pub chunks: u64,
}

/// What the data costs to keep.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct DataUse {
    /// The sizes of every version kept, summed.
    pub protected_bytes: u64,
    /// What the chunks occupy in the pool.
    pub stored_bytes: u64,
    /// Bytes compression saved on the chunks.
    pub saved_by_compression_bytes: u64,
    /// Bytes not stored again because a chunk was held already (and holes, which store
    /// nothing).
    pub saved_by_dedup_bytes: u64,
}

/// The console's first page.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Overview {
    /// The server that answered.
    pub server: String,
    /// When the figures were read (seconds since the epoch).
    pub time: i64,
    pub nodes: NodeCounts,
    pub node_status: Vec<NodeStatus>,
    pub pool: PoolUse,
    pub catalog: CatalogUse,
    pub data: DataUse,
    /// Sessions open, on every server sharing the catalog.
    pub sessions: u64,
    /// Processes running, on every server sharing the catalog.
    pub processes: u64,
}

/// A node's state from its filespaces' last backups, at `now`.
fn status_of(filespaces: &[&FilespaceRow], now: i64) -> (&'static str, Option<i64>) {
    let recent = now - PROTECTED_WITHIN;
    let completed: Vec<Option<i64>> =
        filespaces.iter().map(|f| f.last_completed.map(|r| r.ended)).collect();
    let oldest =
        completed.iter().copied().collect::<Option<Vec<i64>>>().and_then(|v| v.into_iter().min());
    let failed = filespaces.iter().any(|f| {
        f.last_backup.is_some_and(|r| r.result == RunResult::Failed.name() && r.ended >= recent)
    });
    let status = if filespaces.is_empty() || completed.iter().all(Option::is_none) {
        if failed { "failed" } else { "never backed up" }
    } else if failed {
        "failed"
    } else if oldest.is_some_and(|t| t >= recent) {
        "protected"
    } else {
        "at risk"
    };
    (status, oldest)
}

/// The overview for `admin`, read again when the kept one is older than [`KEPT_FOR`].
pub fn read(
    kept: &Kept,
    state: &State,
    admin: qsm_proto::Admin<'_>,
) -> Result<Overview, ServerError> {
    // Asked every time: it checks the caller may query, and names locked nodes now.
    let nodes = admin.nodes()?;
    let mut last = kept.0.lock().unwrap_or_else(|p| p.into_inner());
    // The kept reading serves while it is fresh and names the same nodes; their lock states
    // are this query's.
    if let Some((at, o)) = last.as_ref()
        && at.elapsed() < KEPT_FOR
        && o.node_status.iter().map(|s| &s.name).eq(nodes.iter().map(|n| &n.name))
    {
        let mut o = o.clone();
        for (s, n) in o.node_status.iter_mut().zip(&nodes) {
            s.locked = n.locked;
        }
        return Ok(o);
    }
    let now = qsm_types::now();
    let all = admin.filespaces(None)?;
    let mut by_node: BTreeMap<&str, Vec<&FilespaceRow>> = BTreeMap::new();
    for f in &all {
        by_node.entry(&f.node).or_default().push(f);
    }
    let mut counts = NodeCounts::default();
    let mut node_status = Vec::new();
    for n in &nodes {
        let fs = by_node.get(n.name.as_str()).map_or(&[][..], Vec::as_slice);
        let (status, oldest) = status_of(fs, now);
        counts.total += 1;
        match status {
            "protected" => counts.protected += 1,
            "at risk" => counts.at_risk += 1,
            "failed" => counts.failed += 1,
            _ => counts.never += 1,
        }
        let latest = fs.iter().filter_map(|f| f.last_backup).max_by_key(|r| r.ended);
        node_status.push(NodeStatus {
            name: n.name.clone(),
            status,
            locked: n.locked,
            last_completed: oldest,
            last_result: latest.map(|r| r.result),
            filespaces: fs.len() as u64,
        });
    }
    let mut pool = PoolUse::default();
    for p in admin.stgpools()? {
        pool.containers += p.containers;
        pool.bytes += p.bytes;
        pool.live_bytes += p.live_bytes;
        pool.reclaimable_bytes += p.bytes.saturating_sub(p.live_bytes);
        pool.damaged_chunks += p.damaged_chunks;
    }
    let stats = state.store.catalog().stats().map_err(catalog_error)?;
    let overview = Overview {
        server: state.name.clone(),
        time: now,
        nodes: counts,
        node_status,
        pool,
        catalog: CatalogUse {
            database_bytes: stats.database_bytes,
            objects: stats.objects,
            chunks: stats.chunks,
        },
        data: DataUse {
            protected_bytes: stats.version_bytes,
            stored_bytes: stats.chunk_stored_bytes,
            saved_by_compression_bytes: stats
                .chunk_raw_bytes
                .saturating_sub(stats.chunk_stored_bytes),
            saved_by_dedup_bytes: stats.version_bytes.saturating_sub(stats.chunk_raw_bytes),
        },
        sessions: admin.sessions()?.len() as u64,
        processes: admin.processes()?.len() as u64,
    };
    *last = Some((Instant::now(), overview.clone()));
    Ok(overview)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qsm_proto::reports::RunRow;

    fn fs(last: Option<(i64, &'static str)>, completed: Option<i64>) -> FilespaceRow {
        let run = |ended, result| RunRow {
            started: ended - 10,
            ended,
            result,
            objects: 1,
            bytes: 1,
            warnings: 0,
        };
        FilespaceRow {
            node: "n".into(),
            name: "/".into(),
            id: 1,
            created: 0,
            last_backup: last.map(|(t, r)| run(t, r)),
            last_completed: completed.map(|t| run(t, "completed")),
        }
    }

    #[test]
    fn a_node_is_protected_only_when_every_filespace_completed_lately() {
        let now = 1_000_000;
        let fresh = fs(Some((now - 60, "completed")), Some(now - 60));
        let stale = fs(Some((now - 90_000, "completed")), Some(now - 90_000));
        let failed = fs(Some((now - 60, "failed")), Some(now - 90_000));
        let old_failure = fs(Some((now - 90_000, "failed")), None);
        let never = fs(None, None);
        assert_eq!(status_of(&[&fresh], now), ("protected", Some(now - 60)));
        assert_eq!(status_of(&[&fresh, &stale], now), ("at risk", Some(now - 90_000)));
        assert_eq!(status_of(&[&fresh, &failed], now).0, "failed");
        assert_eq!(status_of(&[&fresh, &never], now).0, "at risk", "one filespace never done");
        assert_eq!(status_of(&[&never], now).0, "never backed up");
        assert_eq!(status_of(&[], now).0, "never backed up");
        assert_eq!(status_of(&[&old_failure], now).0, "never backed up");
        let new_failure = fs(Some((now - 60, "failed")), None);
        assert_eq!(status_of(&[&new_failure], now).0, "failed");
    }
}
