//! Archives as the user made them. The catalog keeps archive objects one by one, each with
//! its description and the time its transaction committed (`inserted`); it records no
//! "archive" as such. One `qsm archive` run of one path is one archive, and this module finds
//! them again, so that two archives with one description can be told apart and retrieved
//! alone instead of merged path by path.
//!
//! How runs are told apart, within one filespace and one description, in commit order
//! (object ids grow with every commit): a run sends its root first (the walk yields it before
//! anything below it) and every path at most once, so an object starts a new archive when its
//! path is not at or below the current archive's first path, or when that archive already
//! holds its path. Commit times are not used: a run spans many transactions, and a slow one
//! may pause for minutes between two. What this cannot separate is two runs of the same
//! description into one filespace at the same time (their objects interleave), or a run of a
//! subtree that holds nothing the previous run of the whole tree held; `qsm archive` warns
//! when a description is reused, which covers both.
//!
//! An archive is named by the id of its first object and dated by that object's commit: the
//! time of the run's first commit.

use std::collections::HashSet;

use qsm_types::model::{FilespaceId, ObjectId, ObjectKind, ObjectVersion, Timestamp};

use crate::error::{ClientError, Result};
use crate::server::{Scope, Server};

/// One archive: the objects one `qsm archive` run stored in one filespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    /// The id of its first object: how `qsm retrieve --id` names it.
    pub id: ObjectId,
    /// Its description.
    pub description: Option<String>,
    /// When its first transaction committed.
    pub date: Timestamp,
    /// The path its run archived (its first object's), below the filespace root.
    pub root: Vec<u8>,
    /// Its objects, in commit order.
    pub objects: Vec<ObjectId>,
}

/// Whether an archive's `paths` hold anything at or below `sub` (`[]`: the filespace root).
pub fn covers(paths: &[Vec<u8>], sub: &[u8]) -> bool {
    paths.iter().any(|p| crate::scan::within(p, sub))
}

/// An archive being gathered: its paths, to see where the next run begins.
struct Open {
    archive: Archive,
    paths: HashSet<Vec<u8>>,
}

/// Groups the archive versions among `versions` (of one filespace, in any order) into
/// archives, oldest first; each archive's paths come with it, in commit order.
pub fn group(versions: Vec<ObjectVersion>) -> Vec<(Archive, Vec<Vec<u8>>)> {
    let mut versions: Vec<ObjectVersion> =
        versions.into_iter().filter(|v| v.kind == ObjectKind::Archive).collect();
    versions.sort_by_key(|v| v.id);
    // The archive being gathered for each description.
    let mut open: Vec<Open> = Vec::new();
    let mut done: Vec<Open> = Vec::new();
    for v in versions {
        let slot = open.iter().position(|o| o.archive.description == v.description);
        let continues = slot.is_some_and(|i| {
            let o = &open[i];
            crate::scan::within(&v.path, &o.archive.root) && !o.paths.contains(&v.path)
        });
        match slot {
            Some(i) if continues => {
                let o = &mut open[i];
                o.archive.objects.push(v.id);
                o.paths.insert(v.path);
            }
            _ => {
                if let Some(i) = slot {
                    done.push(open.swap_remove(i));
                }
                open.push(Open {
                    archive: Archive {
                        id: v.id,
                        description: v.description.clone(),
                        date: v.inserted,
                        root: v.path.clone(),
                        objects: vec![v.id],
                    },
                    paths: HashSet::from([v.path]),
                });
            }
        }
    }
    done.extend(open);
    let mut all: Vec<(Archive, Vec<Vec<u8>>)> = done
        .into_iter()
        .map(|o| {
            let mut paths: Vec<Vec<u8>> = o.paths.into_iter().collect();
            paths.sort();
            (o.archive, paths)
        })
        .collect();
    all.sort_by_key(|(a, _)| a.id);
    all
}

/// The archives of `filespace`, oldest first, with their paths (sorted). Holds the
/// filespace's archive versions in memory while grouping them (not its backups, and without
/// their chunk lists).
pub fn list(server: &dyn Server, filespace: FilespaceId) -> Result<Vec<(Archive, Vec<Vec<u8>>)>> {
    let mut versions = Vec::new();
    server.inventory(filespace, Scope::All, &mut |mut v| {
        if v.kind == ObjectKind::Archive {
            v.chunks = Vec::new();
            versions.push(v);
        }
        Ok(())
    })?;
    Ok(group(versions))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use qsm_types::model::{Attributes, ObjectType};

    fn v(id: i64, path: &str, description: &str, inserted: i64) -> ObjectVersion {
        ObjectVersion {
            id: ObjectId(id),
            filespace: FilespaceId(1),
            path: path.as_bytes().to_vec(),
            kind: ObjectKind::Archive,
            active: false,
            object_type: ObjectType::File,
            attrs: Attributes::default(),
            mgmt_class: None,
            description: Some(description.to_owned()),
            retain_until: None,
            inserted,
            deactivated: None,
            chunks: Vec::new(),
            damaged: false,
        }
    }

    fn ids(groups: &[(Archive, Vec<Vec<u8>>)]) -> Vec<Vec<i64>> {
        groups.iter().map(|(a, _)| a.objects.iter().map(|o| o.0).collect()).collect()
    }

    #[test]
    fn runs_of_one_description_are_told_apart() {
        // Two runs of the whole tree with one description, a third run of another
        // description interleaved with the second, and a run of a sibling subtree.
        let versions = vec![
            v(1, "", "r", 100),
            v(2, "a", "r", 100),
            v(3, "a/x", "r", 160),
            v(4, "", "r", 200),
            v(5, "", "other", 200),
            v(6, "a", "r", 200),
            v(7, "b", "r", 300),
            v(8, "a/x", "other", 200),
        ];
        let groups = group(versions);
        assert_eq!(ids(&groups), vec![vec![1, 2, 3], vec![4, 6, 7], vec![5, 8]]);
        assert_eq!(groups[1].0.date, 200);
        let subtrees = group(vec![v(1, "a", "r", 1), v(2, "a/x", "r", 1), v(3, "b", "r", 2)]);
        assert_eq!(ids(&subtrees), vec![vec![1, 2], vec![3]]);
        assert!(covers(&subtrees[0].1, b"a/x"));
        assert!(!covers(&subtrees[0].1, b"b"));
    }
}

/// The archive `retrieve` takes for a description and/or an id.
#[derive(Debug, Clone)]
pub struct Pick {
    /// The one taken: the newest that matches.
    pub archive: Archive,
    /// Older archives that matched too, newest first (say so: `--id` takes another).
    pub older: Vec<Archive>,
}

/// The one archive `retrieve` takes for `description` and `id`: the one with that id, or the
/// newest of those with that description that hold something at or below `path`. Never
/// several: merging two archives path by path would make a tree that never existed.
pub fn pick(
    server: &dyn Server,
    path: &std::path::Path,
    description: Option<&str>,
    id: Option<i64>,
) -> Result<Pick> {
    let (filespace, sub) = crate::report::locate(server, path)?;
    let sub = sub.unwrap_or_default();
    let fs = server
        .filespaces()?
        .into_iter()
        .find(|f| f.name == filespace)
        .ok_or_else(|| ClientError::Invalid(format!("no filespace {filespace}")))?;
    let mut candidates: Vec<Archive> = list(server, fs.id)?
        .into_iter()
        .filter(|(a, paths)| {
            id.is_none_or(|id| a.id.0 == id)
                && description.is_none_or(|d| a.description.as_deref() == Some(d))
                && covers(paths, &sub)
        })
        .map(|(a, _)| a)
        .collect();
    let shown = path.display();
    let Some(archive) = candidates.pop() else {
        return Err(ClientError::Invalid(match (id, description) {
            (Some(id), _) => format!(
                "nothing to retrieve: no archive {id} of {shown}{} (see `qsm query archive`)",
                description.map(|d| format!(" described {d:?}")).unwrap_or_default()
            ),
            (None, d) => format!(
                "nothing to retrieve: no archive of {shown} is described {:?} (see `qsm query archive`)",
                d.unwrap_or_default()
            ),
        }));
    };
    candidates.reverse();
    Ok(Pick { archive, older: candidates })
}

/// The filespace archiving `path` goes into, and the archives it already holds described
/// `description` (oldest first): `retrieve -d` then takes the newest alone.
pub fn described(
    server: &dyn Server,
    path: &std::path::Path,
    description: &str,
) -> Result<(String, Vec<Archive>)> {
    let (name, _) = crate::backup::target_filespace(server, path, None)?;
    let Some(fs) = server.filespaces()?.into_iter().find(|f| f.name == name) else {
        return Ok((name, Vec::new()));
    };
    let same = list(server, fs.id)?
        .into_iter()
        .filter(|(a, _)| a.description.as_deref() == Some(description))
        .map(|(a, _)| a)
        .collect();
    Ok((name, same))
}
