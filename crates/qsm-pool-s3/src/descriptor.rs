//! The pool descriptor, object `PREFIX/POOL`: byte for byte the `POOL` file of a
//! [`qsm_pool::DirPool`] (layout in `docs/FORMAT.md`, "Storage-pool containers"), so a pool
//! copied between a directory and a bucket keeps its identity. `qsm-pool` keeps its parser
//! private; this is a second implementation of the same layout, and a test checks it against
//! a descriptor `DirPool::create` wrote.

use qsm_pool::{MAX_TARGET_SIZE, MIN_TARGET_SIZE, PoolError, PoolId};
use xxhash_rust::xxh3::xxh3_64;

const POOL_MAGIC: [u8; 4] = *b"QSMP";
const POOL_VERSION: u8 = 1;
pub(crate) const MAX_NAME_LEN: usize = 255;
/// Descriptor bytes besides the name: 42 before it, the 4-byte check after it.
const FIXED_LEN: usize = 46;
/// The longest valid descriptor; `open` reads one byte more to tell a descriptor from a big
/// object without reading all of it.
pub(crate) const MAX_LEN: usize = FIXED_LEN + MAX_NAME_LEN;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Descriptor {
    pub(crate) id: PoolId,
    pub(crate) target_size: u64,
    pub(crate) created: u64,
    pub(crate) name: String,
}

pub(crate) fn check_name(name: &str) -> Result<(), PoolError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
        return Err(PoolError::Invalid(format!(
            "invalid pool name {name:?}: 1 to {MAX_NAME_LEN} bytes without control characters"
        )));
    }
    Ok(())
}

/// The range every pool format accepts; [`crate::S3Pool::create`] narrows it further.
fn check_target(size: u64) -> Result<u64, String> {
    if !(MIN_TARGET_SIZE..=MAX_TARGET_SIZE).contains(&size) {
        return Err(format!(
            "container target size {size} is out of range ({MIN_TARGET_SIZE} to \
             {MAX_TARGET_SIZE} bytes)"
        ));
    }
    Ok(size)
}

impl Descriptor {
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED_LEN + self.name.len());
        b.extend_from_slice(&POOL_MAGIC);
        b.extend_from_slice(&[POOL_VERSION, 0, 0, 0]);
        b.extend_from_slice(&self.id.0);
        b.extend_from_slice(&self.target_size.to_le_bytes());
        b.extend_from_slice(&self.created.to_le_bytes());
        // check_name keeps the name within 255 bytes.
        b.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        b.extend_from_slice(self.name.as_bytes());
        let check = xxh3_64(&b) as u32;
        b.extend_from_slice(&check.to_le_bytes());
        b
    }

    pub(crate) fn parse(b: &[u8]) -> Result<Descriptor, String> {
        if b.len() < FIXED_LEN || b[0..4] != POOL_MAGIC {
            return Err("its POOL object is not a pool descriptor (no \"QSMP\" magic)".into());
        }
        if b[4] != POOL_VERSION {
            return Err(format!(
                "pool descriptor version {} is not supported (this program reads version \
                 {POOL_VERSION})",
                b[4]
            ));
        }
        let name_len = usize::from(u16::from_le_bytes([b[40], b[41]]));
        if b.len() != FIXED_LEN + name_len {
            return Err(format!(
                "the pool descriptor is {} bytes, but its name length says {}: truncated or \
                 damaged",
                b.len(),
                FIXED_LEN + name_len
            ));
        }
        let (body, check) = b.split_at(b.len() - 4);
        if xxh3_64(body) as u32 != u32::from_le_bytes([check[0], check[1], check[2], check[3]]) {
            return Err("the pool descriptor is damaged (check mismatch)".into());
        }
        if b[5..8] != [0; 3] {
            return Err("reserved pool descriptor bytes are not zero".into());
        }
        let u64_at = |at: usize| {
            let mut v = [0u8; 8];
            v.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(v)
        };
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[8..24]);
        let name = std::str::from_utf8(&b[42..42 + name_len])
            .map_err(|_| "the pool name in the descriptor is not UTF-8".to_string())?;
        check_name(name).map_err(|e| e.to_string())?;
        let target_size = check_target(u64_at(24))?;
        Ok(Descriptor { id: PoolId(id), target_size, created: u64_at(32), name: name.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_every_flipped_byte() {
        let d = Descriptor {
            id: PoolId([3; 16]),
            target_size: 64 << 20,
            created: 1_795_305_600,
            name: "S3POOL".into(),
        };
        let b = d.to_bytes();
        assert_eq!(Descriptor::parse(&b), Ok(d));
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x01;
            assert!(Descriptor::parse(&bad).is_err(), "flip in byte {i} accepted");
        }
        assert!(Descriptor::parse(&b[..b.len() - 1]).is_err());
        assert!(Descriptor::parse(&[]).is_err());
    }

    /// The layout must stay the one `DirPool` writes: parse what it wrote, and write the same.
    #[test]
    fn same_layout_as_dir_pool() -> Result<(), Box<dyn std::error::Error>> {
        use qsm_pool::{DirPool, DirPoolOptions, Pool};
        let dir = tempfile::tempdir()?;
        let options = DirPoolOptions { target_size: Some(1 << 20), fsync: false };
        let pool = DirPool::create(dir.path().join("p"), "DIRPOOL", &options)?;
        let bytes = std::fs::read(dir.path().join("p").join("POOL"))?;
        let d = Descriptor::parse(&bytes)?;
        assert_eq!((d.id, d.name.as_str(), d.target_size), (pool.id(), "DIRPOOL", 1 << 20));
        assert_eq!(d.to_bytes(), bytes);
        Ok(())
    }
}
