//! Between the catalog's types and the wire's. Conversions from the wire check what a peer
//! could get wrong (unknown enum values, missing fields) and say which field.

use qsm_catalog::{Attributes, FilespaceId, ObjectId, ObjectKind, ObjectType, ObjectVersion};

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
    }
}

/// Wire attributes in the catalog's terms.
pub fn attributes_from_wire(a: Option<&v1::Attributes>) -> Result<Attributes, Malformed> {
    let a = a.ok_or_else(|| Malformed("attributes missing".into()))?;
    Ok(Attributes {
        size: a.size,
        mtime_ns: a.mtime_ns,
        ctime_ns: a.ctime_ns,
        mode: a.mode,
        uid: a.uid,
        gid: a.gid,
        link_target: a.link_target.as_ref().map(|t| t.to_vec()),
        ino: a.ino,
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
    }
}

/// An object type from its wire value.
pub fn type_from_wire(t: i32) -> Result<ObjectType, Malformed> {
    match v1::ObjectType::try_from(t) {
        Ok(v1::ObjectType::File) => Ok(ObjectType::File),
        Ok(v1::ObjectType::Directory) => Ok(ObjectType::Directory),
        Ok(v1::ObjectType::Symlink) => Ok(ObjectType::Symlink),
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

/// A catalog id (a positive 63-bit integer) from the wire.
pub fn id_from_wire(id: u64, what: &str) -> Result<i64, Malformed> {
    i64::try_from(id).map_err(|_| Malformed(format!("{what} {id} is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut w = version_to_wire(&v);
        w.kind = 9;
        assert!(version_from_wire(&w).unwrap_err().0.contains("kind 9"));
        let mut w = version_to_wire(&v);
        w.attrs = None;
        assert!(version_from_wire(&w).unwrap_err().0.contains("attributes"));
        let mut w = version_to_wire(&v);
        w.id = u64::MAX;
        assert!(version_from_wire(&w).unwrap_err().0.contains("out of range"));
    }
}
