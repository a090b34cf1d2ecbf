//! Between the catalog's types and the wire's. Conversions from the wire check what a peer
//! could get wrong (unknown enum values, missing fields) and say which field.

use qsm_types::model::{ClientOpt, OptionSet};
use qsm_types::node::{Due, Schedules};
use qsm_types::{
    Attributes, BackupRun, Filespace, FilespaceId, NodeId, ObjectId, ObjectKind, ObjectType,
    ObjectVersion, RunResult,
};

use crate::v1;

/// A message from a peer that does not make sense.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed message: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// Catalog attributes on the wire.
pub fn attributes_to_wire(a: &Attributes) -> v1::Attributes {
    v1::Attributes {
        size: a.size,
        mtime_ns: a.mtime_ns,
        ctime_ns: a.ctime_ns,
        mode: a.mode,
        uid: a.uid,
        gid: a.gid,
        link_target: a.link_target.clone().map(Into::into),
        ino: a.ino,
        rdev: a.rdev,
        xattrs: a
            .xattrs
            .iter()
            .map(|(name, value)| v1::Xattr {
                name: name.clone().into(),
                value: value.clone().into(),
            })
            .collect(),
        sparse: a.extents.as_ref().map(|extents| v1::SparseMap {
            data: extents.iter().map(|&(offset, length)| v1::Extent { offset, length }).collect(),
        }),
        sealed_by: a.sealed_by.map(|k| k.to_vec().into()),
    }
}

/// Wire attributes in the catalog's terms.
pub fn attributes_from_wire(a: Option<&v1::Attributes>) -> Result<Attributes, Malformed> {
    let a = a.ok_or_else(|| Malformed("attributes missing".into()))?;
    let extents = a
        .sparse
        .as_ref()
        .map(|s| s.data.iter().map(|e| (e.offset, e.length)).collect::<Vec<(u64, u64)>>());
    if let Some(extents) = &extents {
        qsm_types::model::check_extents(a.size, extents).map_err(Malformed)?;
    }
    Ok(Attributes {
        size: a.size,
        mtime_ns: a.mtime_ns,
        ctime_ns: a.ctime_ns,
        mode: a.mode,
        uid: a.uid,
        gid: a.gid,
        link_target: a.link_target.as_ref().map(|t| t.to_vec()),
        ino: a.ino,
        rdev: a.rdev,
        xattrs: a.xattrs.iter().map(|x| (x.name.to_vec(), x.value.to_vec())).collect(),
        extents,
        sealed_by: match &a.sealed_by {
            None => None,
            Some(k) => Some(k.as_ref().try_into().map_err(|_| {
                Malformed(format!("a sealing key id of {} bytes; key ids have 16", k.len()))
            })?),
        },
    })
}

/// The wire value of an object kind.
pub fn kind_to_wire(k: ObjectKind) -> v1::Kind {
    match k {
        ObjectKind::Backup => v1::Kind::Backup,
        ObjectKind::Archive => v1::Kind::Archive,
    }
}

/// An object kind from its wire value.
pub fn kind_from_wire(k: i32) -> Result<ObjectKind, Malformed> {
    match v1::Kind::try_from(k) {
        Ok(v1::Kind::Backup) => Ok(ObjectKind::Backup),
        Ok(v1::Kind::Archive) => Ok(ObjectKind::Archive),
        Err(_) => Err(Malformed(format!("unknown object kind {k}"))),
    }
}

/// The wire value of an object type.
pub fn type_to_wire(t: ObjectType) -> v1::ObjectType {
    match t {
        ObjectType::File => v1::ObjectType::File,
        ObjectType::Directory => v1::ObjectType::Directory,
        ObjectType::Symlink => v1::ObjectType::Symlink,
        ObjectType::Fifo => v1::ObjectType::Fifo,
        ObjectType::CharDevice => v1::ObjectType::CharDevice,
        ObjectType::BlockDevice => v1::ObjectType::BlockDevice,
        ObjectType::Hardlink => v1::ObjectType::Hardlink,
    }
}

/// An object type from its wire value.
pub fn type_from_wire(t: i32) -> Result<ObjectType, Malformed> {
    match v1::ObjectType::try_from(t) {
        Ok(v1::ObjectType::File) => Ok(ObjectType::File),
        Ok(v1::ObjectType::Directory) => Ok(ObjectType::Directory),
        Ok(v1::ObjectType::Symlink) => Ok(ObjectType::Symlink),
        Ok(v1::ObjectType::Fifo) => Ok(ObjectType::Fifo),
        Ok(v1::ObjectType::CharDevice) => Ok(ObjectType::CharDevice),
        Ok(v1::ObjectType::BlockDevice) => Ok(ObjectType::BlockDevice),
        Ok(v1::ObjectType::Hardlink) => Ok(ObjectType::Hardlink),
        Err(_) => Err(Malformed(format!("unknown object type {t}"))),
    }
}

/// A version on the wire (its chunk ids stay on the server: only their count travels).
pub fn version_to_wire(v: &ObjectVersion) -> v1::Version {
    v1::Version {
        id: v.id.0 as u64,
        filespace: v.filespace.0 as u64,
        path: v.path.clone().into(),
        kind: kind_to_wire(v.kind) as i32,
        active: v.active,
        object_type: type_to_wire(v.object_type) as i32,
        attrs: Some(attributes_to_wire(&v.attrs)),
        description: v.description.clone(),
        retain_until: v.retain_until,
        inserted: v.inserted,
        deactivated: v.deactivated,
        chunks: u32::try_from(v.chunks.len()).unwrap_or(u32::MAX),
    }
}

/// A version from the wire. Its `chunks` list is empty: the server keeps chunk ids.
pub fn version_from_wire(v: &v1::Version) -> Result<ObjectVersion, Malformed> {
    Ok(ObjectVersion {
        id: ObjectId(id_from_wire(v.id, "version id")?),
        filespace: FilespaceId(id_from_wire(v.filespace, "filespace id")?),
        path: v.path.to_vec(),
        kind: kind_from_wire(v.kind)?,
        active: v.active,
        object_type: type_from_wire(v.object_type)?,
        attrs: attributes_from_wire(v.attrs.as_ref())?,
        mgmt_class: None,
        description: v.description.clone(),
        retain_until: v.retain_until,
        inserted: v.inserted,
        deactivated: v.deactivated,
        chunks: Vec::new(),
        damaged: false,
    })
}

/// A backup run on the wire.
pub fn run_to_wire(r: &BackupRun) -> v1::BackupRun {
    v1::BackupRun {
        started: r.started,
        ended: r.ended,
        result: r.result.name().into(),
        objects: r.objects,
        bytes: r.bytes,
        warnings: r.warnings,
    }
}

/// A filespace on the wire (its node is the session's, not sent).
pub fn filespace_to_wire(f: &Filespace) -> v1::Filespace {
    let run = run_to_wire;
    v1::Filespace {
        id: f.id.0 as u64,
        name: f.name.clone(),
        created: f.created,
        generation: f.generation,
        last_backup: f.last_backup.as_ref().map(run),
        last_completed: f.last_completed.as_ref().map(run),
    }
}

/// A filespace of `node` from the wire.
pub fn filespace_from_wire(f: &v1::Filespace, node: NodeId) -> Result<Filespace, Malformed> {
    let run = |r: &v1::BackupRun| -> Result<BackupRun, Malformed> {
        Ok(BackupRun {
            started: r.started,
            ended: r.ended,
            result: RunResult::parse(&r.result)
                .ok_or_else(|| Malformed(format!("backup result {:?}", r.result)))?,
            objects: r.objects,
            bytes: r.bytes,
            warnings: r.warnings,
        })
    };
    Ok(Filespace {
        id: FilespaceId(id_from_wire(f.id, "filespace id")?),
        node,
        name: f.name.clone(),
        created: f.created,
        generation: f.generation,
        last_backup: f.last_backup.as_ref().map(run).transpose()?,
        last_completed: f.last_completed.as_ref().map(run).transpose()?,
    })
}

/// A catalog id (a positive 63-bit integer) from the wire.
pub fn id_from_wire(id: u64, what: &str) -> Result<i64, Malformed> {
    i64::try_from(id).map_err(|_| Malformed(format!("{what} {id} is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filespaces_round_trip_and_a_bad_result_is_named() {
        let run = |result| BackupRun {
            started: 10,
            ended: 20,
            result,
            objects: 3,
            bytes: u64::MAX,
            warnings: 1,
        };
        let f = Filespace {
            id: FilespaceId(5),
            node: NodeId(2),
            name: "/home".into(),
            created: 1,
            generation: -7,
            last_backup: Some(run(RunResult::Failed)),
            last_completed: Some(run(RunResult::CompletedWithWarnings)),
        };
        assert_eq!(filespace_from_wire(&filespace_to_wire(&f), NodeId(2)), Ok(f.clone()));
        let never = Filespace { last_backup: None, last_completed: None, ..f.clone() };
        assert_eq!(filespace_from_wire(&filespace_to_wire(&never), NodeId(2)), Ok(never));
        let mut wire = filespace_to_wire(&f);
        if let Some(r) = wire.last_backup.as_mut() {
            r.result = "exploded".into();
        }
        let e = filespace_from_wire(&wire, NodeId(2)).unwrap_err();
        assert!(e.0.contains("exploded"), "{e}");
    }

    #[test]
    fn versions_round_trip_and_bad_enums_are_named() {
        let v = ObjectVersion {
            id: ObjectId(7),
            filespace: FilespaceId(3),
            path: b"a/\xffb".to_vec(),
            kind: ObjectKind::Archive,
            active: false,
            object_type: ObjectType::Symlink,
            attrs: Attributes {
                size: 5,
                mtime_ns: -1,
                ctime_ns: 2,
                mode: 0o120777,
                uid: 1,
                gid: 2,
                link_target: Some(b"t".to_vec()),
                ino: 99,
                rdev: 0x0801,
                xattrs: vec![(b"user.\xff".to_vec(), vec![0, 1]), (b"user.e".to_vec(), vec![])],
                extents: None,
                sealed_by: Some([7; 16]),
            },
            mgmt_class: None,
            description: Some("d".into()),
            retain_until: Some(9),
            inserted: 4,
            deactivated: Some(6),
            chunks: Vec::new(),
            damaged: false,
        };
        assert_eq!(version_from_wire(&version_to_wire(&v)), Ok(v.clone()));
        for t in [
            ObjectType::Fifo,
            ObjectType::CharDevice,
            ObjectType::BlockDevice,
            ObjectType::Hardlink,
        ] {
            let v = ObjectVersion { object_type: t, ..v.clone() };
            assert_eq!(version_from_wire(&version_to_wire(&v)), Ok(v));
        }
        let mut w = version_to_wire(&v);
        if let Some(a) = w.attrs.as_mut() {
            a.sealed_by = Some(vec![7; 15].into());
        }
        assert!(version_from_wire(&w).unwrap_err().0.contains("key ids have 16"));
        let mut w = version_to_wire(&v);
        w.kind = 9;
        assert!(version_from_wire(&w).unwrap_err().0.contains("kind 9"));
        // Sparse: extents round-trip, an empty map (all hole) stays sparse, and extents
        // outside the file are refused.
        for extents in [vec![(0, 2), (3, 2)], vec![]] {
            let mut s = v.clone();
            s.attrs.extents = Some(extents);
            assert_eq!(version_from_wire(&version_to_wire(&s)), Ok(s));
        }
        let mut s = v.clone();
        s.attrs.extents = Some(vec![(4, 2)]);
        assert!(version_from_wire(&version_to_wire(&s)).unwrap_err().0.contains("extent 0"));
        let mut w = version_to_wire(&v);
        w.attrs = None;
        assert!(version_from_wire(&w).unwrap_err().0.contains("attributes"));
        let mut w = version_to_wire(&v);
        w.id = u64::MAX;
        assert!(version_from_wire(&w).unwrap_err().0.contains("out of range"));
    }
}

/// An option set as the protocol carries it.
pub fn cloptset_to_wire(set: &OptionSet) -> v1::Cloptset {
    v1::Cloptset {
        name: set.name.clone(),
        description: set.description.clone(),
        options: set
            .options
            .iter()
            .map(|o| v1::ClientOption {
                name: o.name.clone(),
                value: o.value.clone(),
                force: o.force,
            })
            .collect(),
    }
}

/// The option set a node uses, from the protocol (one with no name: none).
pub fn cloptset_from_wire(set: v1::Cloptset) -> Option<OptionSet> {
    (!set.name.is_empty()).then(|| OptionSet {
        name: set.name,
        description: set.description,
        options: set
            .options
            .into_iter()
            .map(|o| ClientOpt { name: o.name, value: o.value, force: o.force })
            .collect(),
    })
}

/// A node's schedules as the protocol carries them.
pub fn schedules_to_wire(s: Schedules) -> v1::DueList {
    v1::DueList {
        now: s.now,
        due: s
            .due
            .into_iter()
            .map(|d| v1::Due {
                domain: d.domain,
                schedule: d.schedule,
                action: d.action,
                objects: d.objects,
                window_start: d.window_start,
                window_end: d.window_end,
            })
            .collect(),
    }
}

/// A node's schedules from the protocol.
pub fn schedules_from_wire(s: v1::DueList) -> Schedules {
    Schedules {
        now: s.now,
        due: s
            .due
            .into_iter()
            .map(|d| Due {
                domain: d.domain,
                schedule: d.schedule,
                action: d.action,
                objects: d.objects,
                window_start: d.window_start,
                window_end: d.window_end,
            })
            .collect(),
    }
}
