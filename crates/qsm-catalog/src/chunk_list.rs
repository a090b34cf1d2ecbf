//! The ordered chunk list of an object, stored in the object's row as one blob instead of one
//! row per chunk: chunks of one file are inserted together and get consecutive ids, so
//! delta-encoded LEB128 varints take about one byte per chunk, where a row per chunk costs
//! over 20. This keeps the catalog under 300 bytes per object version (docs/PERFORMANCE.md).
//!
//! Layout: the first id as a zigzag varint, then each following id as the zigzag varint of
//! its difference from the previous one.

use crate::error::{CatalogError, Result};
use crate::model::ChunkRowId;

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Encodes `ids`.
pub fn encode(ids: &[ChunkRowId]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() + 8);
    let mut prev = 0i64;
    for id in ids {
        let mut v = zigzag(id.0.wrapping_sub(prev));
        prev = id.0;
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
    }
    out
}

/// Decodes a list written by [`encode`]; damaged bytes are an error, never a panic.
pub fn decode(bytes: &[u8]) -> Result<Vec<ChunkRowId>> {
    let mut out = Vec::with_capacity(bytes.len());
    let (mut prev, mut v, mut shift) = (0i64, 0u64, 0u32);
    for (i, &b) in bytes.iter().enumerate() {
        if shift > 63 {
            return Err(CatalogError::Damaged(format!("chunk list varint too long at byte {i}")));
        }
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            prev = prev.wrapping_add(unzigzag(v));
            out.push(ChunkRowId(prev));
            (v, shift) = (0, 0);
        } else {
            shift += 7;
        }
    }
    if shift != 0 {
        return Err(CatalogError::Damaged("chunk list ends inside a varint".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_is_compact() -> Result<()> {
        let cases: Vec<Vec<i64>> = vec![
            vec![],
            vec![1],
            vec![5, 6, 7, 8, 9],
            vec![i64::MAX, 0, i64::MIN, -1, 300, 299],
            (1_000_000..1_001_000).collect(),
        ];
        for ids in cases {
            let ids: Vec<ChunkRowId> = ids.into_iter().map(ChunkRowId).collect();
            assert_eq!(decode(&encode(&ids))?, ids);
        }
        let run: Vec<ChunkRowId> = (1_000_000..1_001_000).map(ChunkRowId).collect();
        assert!(encode(&run).len() <= 1003);
        Ok(())
    }

    #[test]
    fn damage_is_an_error() {
        assert!(decode(&[0x80]).is_err());
        assert!(decode(&[0xff; 11]).is_err());
    }
}
