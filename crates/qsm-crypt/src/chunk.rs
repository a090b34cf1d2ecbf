//! Chunk ids: a BLAKE3 keyed hash of a chunk's plaintext.
//!
//! Keyed, so an id reveals nothing about the content to anyone without the key: the server,
//! a thief of the pool, or another node cannot confirm a guess of a chunk's content by
//! hashing it. Nodes that share a key (an administrator's dedup group) share ids, and only
//! they can deduplicate against each other.

use crate::key::MasterKey;

/// A 256-bit chunk id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub [u8; 32]);

/// The key chunk ids are made with.
#[derive(Clone)]
pub struct ChunkIdKey([u8; 32]);

impl std::fmt::Debug for ChunkIdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChunkIdKey(..)")
    }
}

impl ChunkIdKey {
    /// The chunk-id key of a master key.
    pub fn of(master: &MasterKey) -> ChunkIdKey {
        ChunkIdKey(master.derive("QSM 2026-11-23 chunk id v1"))
    }

    /// A chunk-id key from a secret the server keeps for a dedup scope, for nodes that
    /// deduplicate without encryption (the server sees their plaintext anyway). Derived, so
    /// the secret itself never keys BLAKE3 directly.
    pub fn from_scope_secret(secret: &[u8; 32]) -> ChunkIdKey {
        ChunkIdKey(blake3::derive_key("QSM 2026-11-23 scope chunk id v1", secret))
    }

    /// The seed of the chunker's gear table for this key (see `qsm_client::chunker`): chunk
    /// boundaries then depend on the key too.
    pub fn chunker_seed(&self) -> u64 {
        let d = blake3::derive_key("QSM 2026-11-23 chunker seed v1", &self.0);
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
    }

    /// The id of `data`.
    pub fn id(&self, data: &[u8]) -> ChunkId {
        ChunkId(*blake3::keyed_hash(&self.0, data).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ids_depend_on_the_key_and_the_content_only() {
        let (a, b) = (MasterKey::generate().unwrap(), MasterKey::generate().unwrap());
        let (ka, kb) = (ChunkIdKey::of(&a), ChunkIdKey::of(&b));
        assert_eq!(ka.id(b"chunk"), ChunkIdKey::of(&a).id(b"chunk"));
        assert_ne!(ka.id(b"chunk"), ka.id(b"chunk!"));
        assert_ne!(ka.id(b"chunk"), kb.id(b"chunk"), "another node's key gives another id");
        assert_ne!(ka.id(b"chunk").0, *blake3::hash(b"chunk").as_bytes(), "not the plain hash");
    }
}
