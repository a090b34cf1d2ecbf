//! The `meta` column of an object version: the file-system metadata beyond the fixed columns
//! (a device's number, extended attributes and ACLs), in one small versioned binary encoding,
//! the same for both backends. An object without any of it stores NULL, so the column costs
//! nothing for the ordinary file.
//!
//! Layout (docs/FORMAT.md, "Object metadata"): one version byte (1), then records, each
//! `tag: u8`, `len: u32 LE`, `len` bytes of value:
//!
//! | tag | value |
//! |---|---|
//! | 1 | `rdev`: u64 LE (a device's number); absent when 0 |
//! | 2 | one extended attribute: `name_len: u32 LE`, name, then the value (the rest) |
//! | 4 | the key the data was sealed with: its fingerprint's 16 bytes; absent for data in the clear or recorded before it was |
//! | 3 | a sparse file's data extents: `(offset: u64 LE, length: u64 LE)` pairs in file order, not overlapping, each of length > 0, ending within the size; present (even empty, for a file all hole) only for a sparse file |
//!
//! Extended attributes appear in the order they were recorded. A record of an unknown tag is
//! an error, not skipped: it was written by a newer version, and restoring without it would
//! silently lose what it holds.

use crate::model::Attributes;

pub use qsm_types::model::MAX_EXTENTS;

/// The encoding's version byte.
pub const VERSION: u8 = 1;
const TAG_RDEV: u8 = 1;
const TAG_XATTR: u8 = 2;
const TAG_EXTENTS: u8 = 3;
const TAG_SEALED_BY: u8 = 4;

/// Why a `meta` value could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaError(pub String);

impl std::fmt::Display for MetaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "object metadata: {}", self.0)
    }
}

impl std::error::Error for MetaError {}

/// Encodes the extra metadata of `a`, or `None` when there is none (the column is NULL).
pub fn encode(a: &Attributes) -> Option<Vec<u8>> {
    if a.rdev == 0 && a.xattrs.is_empty() && a.extents.is_none() && a.sealed_by.is_none() {
        return None;
    }
    let mut out = vec![VERSION];
    let mut record = |tag: u8, parts: &[&[u8]]| {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        out.push(tag);
        // An xattr value is at most 64 KiB on Linux, names 255 bytes: far below u32.
        out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
        for p in parts {
            out.extend_from_slice(p);
        }
    };
    if a.rdev != 0 {
        record(TAG_RDEV, &[&a.rdev.to_le_bytes()]);
    }
    for (name, value) in &a.xattrs {
        let name_len = u32::try_from(name.len()).unwrap_or(u32::MAX).to_le_bytes();
        record(TAG_XATTR, &[&name_len, name, value]);
    }
    if let Some(extents) = &a.extents {
        let bytes: Vec<u8> = extents
            .iter()
            .flat_map(|(offset, len)| offset.to_le_bytes().into_iter().chain(len.to_le_bytes()))
            .collect();
        record(TAG_EXTENTS, &[&bytes]);
    }
    if let Some(key) = &a.sealed_by {
        record(TAG_SEALED_BY, &[key]);
    }
    Some(out)
}

/// [`qsm_types::model::check_extents`], its complaint as the format's.
pub fn check_extents(size: u64, extents: &[(u64, u64)]) -> Result<(), MetaError> {
    qsm_types::model::check_extents(size, extents).map_err(MetaError)
}

/// Reads object `id`'s `meta` column, if it holds a value, into `attrs`: what both backends do
/// with the column they read, with the damage named as the catalog's.
pub fn apply(id: i64, meta: Option<&[u8]>, attrs: &mut Attributes) -> crate::Result<()> {
    match meta {
        None => Ok(()),
        Some(m) => {
            decode(m, attrs).map_err(|e| crate::CatalogError::Damaged(format!("object {id}: {e}")))
        }
    }
}

/// Reads a `meta` value into `a` (its `rdev`, `xattrs` and `extents`; `a.size` must be set,
/// extents are checked against it). Damaged or truncated bytes are an error naming what is
/// wrong, never a panic.
pub fn decode(bytes: &[u8], a: &mut Attributes) -> Result<(), MetaError> {
    let (&version, mut rest) =
        bytes.split_first().ok_or_else(|| MetaError("empty value".into()))?;
    if version != VERSION {
        return Err(MetaError(format!(
            "encoding version {version}, this program reads {VERSION}: written by a newer QSM"
        )));
    }
    a.rdev = 0;
    a.xattrs.clear();
    a.extents = None;
    a.sealed_by = None;
    while let Some((&tag, tail)) = rest.split_first() {
        let (len, tail) = take_u32(tail)
            .ok_or_else(|| MetaError(format!("record of tag {tag} truncated in its length")))?;
        let len = len as usize;
        if tail.len() < len {
            return Err(MetaError(format!(
                "record of tag {tag} holds {len} bytes, only {} remain",
                tail.len()
            )));
        }
        let (value, tail) = tail.split_at(len);
        rest = tail;
        match tag {
            TAG_RDEV => {
                let v: [u8; 8] = value
                    .try_into()
                    .map_err(|_| MetaError(format!("device number of {len} bytes, not 8")))?;
                a.rdev = u64::from_le_bytes(v);
            }
            TAG_SEALED_BY => {
                let key: [u8; 16] = value
                    .try_into()
                    .map_err(|_| MetaError(format!("sealing key id of {len} bytes, not 16")))?;
                a.sealed_by = Some(key);
            }
            TAG_XATTR => {
                let (name_len, value) = take_u32(value)
                    .ok_or_else(|| MetaError("extended attribute without a name length".into()))?;
                let name_len = name_len as usize;
                if value.len() < name_len || name_len == 0 {
                    return Err(MetaError(format!(
                        "extended attribute name of {name_len} bytes in a record of {len}"
                    )));
                }
                let (name, value) = value.split_at(name_len);
                a.xattrs.push((name.to_vec(), value.to_vec()));
            }
            TAG_EXTENTS => {
                if !len.is_multiple_of(16) {
                    return Err(MetaError(format!("data extents of {len} bytes, not pairs")));
                }
                let u64_at = |b: &[u8]| {
                    let mut v = [0u8; 8];
                    v.copy_from_slice(b);
                    u64::from_le_bytes(v)
                };
                let extents: Vec<(u64, u64)> =
                    value.chunks_exact(16).map(|p| (u64_at(&p[..8]), u64_at(&p[8..]))).collect();
                check_extents(a.size, &extents)?;
                a.extents = Some(extents);
            }
            other => {
                return Err(MetaError(format!(
                    "unknown record tag {other}: written by a newer QSM"
                )));
            }
        }
    }
    Ok(())
}

fn take_u32(b: &[u8]) -> Option<(u32, &[u8])> {
    let (head, tail) = b.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*head), tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Attributes {
        Attributes {
            rdev: 0x0103_0000_0000_0807,
            xattrs: vec![
                (b"user.a".to_vec(), b"1".to_vec()),
                (b"security.capability".to_vec(), vec![0, 0, 0, 2, 0, 32, 0, 0]),
                (b"user.empty".to_vec(), Vec::new()),
                (b"user.\xff".to_vec(), vec![0xff; 70_000]),
            ],
            size: 8 << 30,
            extents: Some(vec![(0, 4096), (1 << 30, 8192), ((8 << 30) - 1, 1)]),
            sealed_by: Some(*b"0123456789abcdef"),
            ..Attributes::default()
        }
    }

    #[test]
    fn round_trips_and_empty_is_null() {
        let a = sample();
        let bytes = encode(&a).unwrap();
        let mut b = Attributes { size: a.size, ..Attributes::default() };
        decode(&bytes, &mut b).unwrap();
        assert_eq!((b.rdev, &b.xattrs, &b.extents), (a.rdev, &a.xattrs, &a.extents));
        assert_eq!(b.sealed_by, a.sealed_by);
        let mut bad = bytes.clone();
        let at = bytes.len() - 16 - 5;
        assert_eq!(bad[at], 4, "the sealing key's record is last");
        bad[at + 1] = 15; // a 15-byte key id, the last byte left over as garbage
        assert!(decode(&bad, &mut b).is_err());
        assert_eq!(b.data_len(), 4096 + 8192 + 1);
        // A file all hole: sparse, with no extent at all.
        let hole = Attributes { size: 5, extents: Some(Vec::new()), ..Attributes::default() };
        let mut c = Attributes { size: 5, ..Attributes::default() };
        decode(&encode(&hole).unwrap(), &mut c).unwrap();
        assert_eq!((c.data_len(), c.extents), (0, Some(Vec::new())));
        assert_eq!(encode(&Attributes::default()), None);
        let only_xattr =
            Attributes { xattrs: vec![(b"user.x".to_vec(), b"v".to_vec())], ..Default::default() };
        let mut c = Attributes { rdev: 5, ..Default::default() };
        decode(&encode(&only_xattr).unwrap(), &mut c).unwrap();
        assert_eq!((c.rdev, c.xattrs), (0, only_xattr.xattrs));
    }

    #[test]
    fn pinned_bytes() {
        let a = Attributes {
            rdev: 0x0801,
            xattrs: vec![(b"user.k".to_vec(), b"v".to_vec())],
            ..Attributes::default()
        };
        let expected: &[u8] = &[
            1, // version
            1, 8, 0, 0, 0, 1, 8, 0, 0, 0, 0, 0, 0, // rdev
            2, 11, 0, 0, 0, 6, 0, 0, 0, b'u', b's', b'e', b'r', b'.', b'k', b'v', // xattr
        ];
        assert_eq!(encode(&a).as_deref(), Some(expected));
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error() {
        let bytes = encode(&sample()).unwrap();
        // Every cut that does not fall on a record boundary fails, none panics.
        let mut boundaries = vec![1usize];
        let mut at = 1;
        while at < bytes.len() {
            let len = u32::from_le_bytes(bytes[at + 1..at + 5].try_into().unwrap()) as usize;
            at += 5 + len;
            boundaries.push(at);
        }
        for cut in 0..bytes.len() {
            let mut a = Attributes { size: 8 << 30, ..Attributes::default() };
            let r = decode(&bytes[..cut], &mut a);
            assert_eq!(r.is_ok(), boundaries.contains(&cut), "cut at {cut}: {r:?}");
        }
        let mut a = Attributes::default();
        let mut bad = bytes.clone();
        bad[0] = 2;
        assert!(decode(&bad, &mut a).unwrap_err().0.contains("version 2"));
        let mut bad = bytes.clone();
        bad[1] = 9;
        assert!(decode(&bad, &mut a).unwrap_err().0.contains("unknown record tag 9"));
        let mut bad = bytes.clone();
        bad[2] = 7; // rdev record of 7 bytes
        assert!(decode(&bad, &mut a).is_err());
        // Extents that would put data outside the file, out of order, or nowhere.
        for bad in [
            vec![(0, 10)],
            vec![(4, 2), (0, 2)],
            vec![(0, 4), (3, 2)],
            vec![(2, 0)],
            vec![(u64::MAX, 2)],
        ] {
            let x = Attributes { size: 8, extents: Some(bad.clone()), ..Default::default() };
            let mut a = Attributes { size: 8, ..Default::default() };
            assert!(decode(&encode(&x).unwrap(), &mut a).is_err(), "{bad:?}");
        }
        // An xattr whose name length runs past its record.
        let x =
            Attributes { xattrs: vec![(b"user.k".to_vec(), b"v".to_vec())], ..Default::default() };
        let mut bad = encode(&x).unwrap();
        bad[6] = 200;
        assert!(decode(&bad, &mut a).unwrap_err().0.contains("name of 200 bytes"));
    }
}
