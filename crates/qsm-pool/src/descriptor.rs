//! The pool descriptor: a pool's identity (id, name, container target size, creation time),
//! the `POOL` file of a [`crate::DirPool`] and the `PREFIX/POOL` object of an S3 pool, byte for
//! byte the same, so a pool copied between a directory and a bucket keeps its identity.
//! Layout in `docs/FORMAT.md`, "Storage-pool containers".

use std::fs::File;
use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

use xxhash_rust::xxh3::xxh3_64;

use crate::{MAX_TARGET_SIZE, MIN_TARGET_SIZE, PoolError, PoolId};

const POOL_MAGIC: [u8; 4] = *b"QSMP";
const POOL_VERSION: u8 = 1;
/// The longest pool name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Descriptor bytes besides the name: 42 before it, the 4-byte check after it.
const FIXED_LEN: usize = 46;
/// The longest valid descriptor: reading one byte more tells a descriptor from a large
/// object or file without reading all of it.
pub const MAX_LEN: usize = FIXED_LEN + MAX_NAME_LEN;

/// A pool's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// The id written into every container header.
    pub id: PoolId,
    /// Containers are sealed at about this size.
    pub target_size: u64,
    /// Seconds since the epoch.
    pub created: u64,
    /// The administrator's name for it.
    pub name: String,
}

/// Refuses a name no descriptor can hold.
pub fn check_name(name: &str) -> Result<(), PoolError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
        return Err(PoolError::Invalid(format!(
            "invalid pool name {name:?}: 1 to {MAX_NAME_LEN} bytes without control characters"
        )));
    }
    Ok(())
}

/// Refuses a target size outside the range every pool format accepts (a backend may narrow
/// it further).
pub fn check_target(size: u64) -> Result<u64, PoolError> {
    if !(MIN_TARGET_SIZE..=MAX_TARGET_SIZE).contains(&size) {
        return Err(PoolError::Invalid(format!(
            "container target size {size} is out of range ({MIN_TARGET_SIZE} to \
             {MAX_TARGET_SIZE} bytes)"
        )));
    }
    Ok(size)
}

/// Fills `buf` from the kernel's generator (pool and container ids).
pub fn random_bytes(buf: &mut [u8]) -> Result<(), PoolError> {
    // Reading it needs no dependency.
    const SOURCE: &str = "/dev/urandom";
    File::open(SOURCE).and_then(|mut f| f.read_exact(buf)).map_err(|source| PoolError::Io {
        op: "reading random bytes from",
        path: SOURCE.into(),
        source,
    })
}

/// A random container id for a new container; never 0, which is left free for callers that
/// need a "no container" value. The backend still makes sure it is new in its pool.
pub fn random_container_id() -> Result<crate::ContainerId, PoolError> {
    loop {
        let mut b = [0u8; 8];
        random_bytes(&mut b)?;
        let id = u64::from_le_bytes(b);
        if id != 0 {
            return Ok(id);
        }
    }
}

/// Seconds since the epoch (0 before it).
pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Descriptor {
    /// A new pool's descriptor: a random id, created now.
    pub fn new(name: &str, target_size: u64) -> Result<Descriptor, PoolError> {
        check_name(name)?;
        let target_size = check_target(target_size)?;
        let mut id = [0u8; 16];
        random_bytes(&mut id)?;
        Ok(Descriptor { id: PoolId(id), target_size, created: now_secs(), name: name.into() })
    }

    /// Its bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
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

    /// Parses and checks a descriptor; the error says what is wrong with it.
    pub fn parse(b: &[u8]) -> Result<Descriptor, String> {
        if b.len() < FIXED_LEN || b[0..4] != POOL_MAGIC {
            return Err("it is not a pool descriptor (no \"QSMP\" magic)".into());
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
        let target_size = check_target(u64_at(24)).map_err(|e| e.to_string())?;
        Ok(Descriptor { id: PoolId(id), target_size, created: u64_at(32), name: name.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_round_trips_and_rejects_every_flipped_byte() {
        let d = Descriptor {
            id: PoolId([3; 16]),
            target_size: crate::DEFAULT_TARGET_SIZE,
            created: 1_795_305_600,
            name: "BACKUPPOOL".into(),
        };
        let b = d.to_bytes();
        assert_eq!(b.len(), FIXED_LEN + 10);
        assert_eq!(Descriptor::parse(&b), Ok(d));
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x01;
            assert!(Descriptor::parse(&bad).is_err(), "flip in byte {i} accepted");
        }
        assert!(Descriptor::parse(&b[..b.len() - 1]).is_err());
        assert!(Descriptor::parse(&[]).is_err());
    }
}
