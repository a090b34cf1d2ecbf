//! The client's side of deduplication: a local cache of chunk ids the server has committed.
//!
//! Which occurrence of a chunk is sent is decided by the backup's reader, in stream order,
//! before any worker sees it (`backup.rs`): the first occurrence is sent and later ones
//! reference it, so no two workers ever send one chunk and a reference never precedes the
//! frame it names. (An earlier design let workers race for claims; deciding in order needs no
//! lock and keeps the output identical for any thread count.)
//!
//! The cache only saves questions: a chunk it lists is not sent, and the server still checks
//! at commit that every chunk an object names exists, so a stale cache can fail a backup but
//! never lose data. It is tied to one server (its pool id) and to the server's *dedup epoch*,
//! a number the server raises whenever chunks may have gone (expiration, reclamation, a
//! catalog restore); a cache from another server or epoch is discarded whole.
//!
//! File layout, version 1 (integers little-endian): magic `QSMD`, version 1, 3 reserved
//! bytes, epoch (u64), server id length (u16) and bytes, id count (u32), the 32-byte ids,
//! then XXH3-64 of everything before it. A file that fails any check is discarded (and said
//! so): the cache is advisory.

use std::collections::{HashSet, VecDeque};
use std::io::Write;
use std::path::Path;

use qsm_crypt::ChunkId;

const MAGIC: &[u8; 4] = b"QSMD";
const VERSION: u8 = 1;

/// Chunk ids known to be committed on one server, at most `capacity` of them (the oldest
/// inserted go first).
#[derive(Debug)]
pub struct DedupCache {
    server: String,
    epoch: u64,
    capacity: usize,
    ids: HashSet<ChunkId>,
    order: VecDeque<ChunkId>,
}

impl DedupCache {
    /// An empty cache for `server` at `epoch`.
    pub fn new(server: &str, epoch: u64, capacity: usize) -> DedupCache {
        DedupCache {
            server: server.to_owned(),
            epoch,
            capacity: capacity.max(1),
            ids: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    /// The cache saved at `path` if it belongs to `server` at `epoch` and is intact; else an
    /// empty one and the reason the file was not used (none when there was no file).
    pub fn load(
        path: &Path,
        server: &str,
        epoch: u64,
        capacity: usize,
    ) -> (DedupCache, Option<String>) {
        let mut cache = DedupCache::new(server, epoch, capacity);
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (cache, None),
            Err(e) => return (cache, Some(format!("{}: {e}", path.display()))),
        };
        match parse(&bytes) {
            Err(why) => (cache, Some(format!("{}: {why}; starting empty", path.display()))),
            Ok((s, _, _)) if s != server => (
                cache,
                Some(format!("{}: made for another server; starting empty", path.display())),
            ),
            Ok((_, e, _)) if e != epoch => (
                cache,
                Some(format!(
                    "{}: the server's chunks changed since (epoch {e}, now {epoch}); starting empty",
                    path.display()
                )),
            ),
            Ok((_, _, ids)) => {
                for id in ids {
                    cache.insert(id);
                }
                (cache, None)
            }
        }
    }

    /// Whether `id` is known committed.
    pub fn contains(&self, id: &ChunkId) -> bool {
        self.ids.contains(id)
    }

    /// Records `id` as committed (call only after the server confirmed the commit).
    pub fn insert(&mut self, id: ChunkId) {
        if self.ids.insert(id) {
            self.order.push_back(id);
            while self.order.len() > self.capacity {
                if let Some(old) = self.order.pop_front() {
                    self.ids.remove(&old);
                }
            }
        }
    }

    /// Ids held.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Writes the cache to `path` through a temporary file renamed into place.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let server = self.server.as_bytes();
        let len = u16::try_from(server.len())
            .map_err(|_| std::io::Error::other("server id longer than 65535 bytes"))?;
        let mut b = Vec::with_capacity(26 + server.len() + 32 * self.order.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&[VERSION, 0, 0, 0]);
        b.extend_from_slice(&self.epoch.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(server);
        b.extend_from_slice(&(self.order.len() as u32).to_le_bytes());
        for id in &self.order {
            b.extend_from_slice(&id.0);
        }
        let check = xxhash_rust::xxh3::xxh3_64(&b);
        b.extend_from_slice(&check.to_le_bytes());
        let tmp = path.with_extension("new");
        // Owner-only: the ids tell what content the node holds. Exclusive, after removing a
        // crashed save's leftover, so nothing planted at the name is written through.
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::os::unix::fs::OpenOptionsExt::mode(
            std::fs::OpenOptions::new().write(true).create_new(true),
            0o600,
        )
        .open(&tmp)?;
        f.write_all(&b)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

fn parse(b: &[u8]) -> Result<(String, u64, Vec<ChunkId>), String> {
    let body_len = b.len().checked_sub(8).ok_or("truncated")?;
    let (body, check) = b.split_at(body_len);
    let mut c = [0u8; 8];
    c.copy_from_slice(check);
    if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(c) {
        return Err("checksum mismatch".into());
    }
    let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
        let s = body.get(*at..*at + n).ok_or("truncated")?;
        *at += n;
        Ok(s)
    };
    let mut at = 0;
    if take(&mut at, 4)? != MAGIC {
        return Err("not a dedup cache".into());
    }
    let v = take(&mut at, 4)?;
    if v[0] != VERSION {
        return Err(format!("version {}", v[0]));
    }
    let mut e = [0u8; 8];
    e.copy_from_slice(take(&mut at, 8)?);
    let l = take(&mut at, 2)?;
    let server =
        String::from_utf8(take(&mut at, usize::from(u16::from_le_bytes([l[0], l[1]])))?.to_vec())
            .map_err(|_| "server id is not UTF-8")?;
    let n = take(&mut at, 4)?;
    let n = u32::from_le_bytes([n[0], n[1], n[2], n[3]]) as usize;
    if body.len() - at != n.checked_mul(32).ok_or("count overflows")? {
        return Err("length disagrees with the id count".into());
    }
    let ids = body[at..]
        .chunks_exact(32)
        .map(|c| {
            let mut id = [0u8; 32];
            id.copy_from_slice(c);
            ChunkId(id)
        })
        .collect();
    Ok((server, u64::from_le_bytes(e), ids))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn id(n: u8) -> ChunkId {
        ChunkId([n; 32])
    }

    #[test]
    fn the_cache_is_bounded_and_survives_a_save() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dedup");
        let mut c = DedupCache::new("pool-a", 7, 3);
        for n in 1..=5 {
            c.insert(id(n));
        }
        c.insert(id(5));
        assert_eq!(c.len(), 3);
        assert!(!c.contains(&id(2)) && c.contains(&id(3)) && c.contains(&id(5)));
        c.save(&path).unwrap();
        let (back, why) = DedupCache::load(&path, "pool-a", 7, 10);
        assert_eq!(why, None);
        assert!(back.contains(&id(3)) && back.contains(&id(4)) && back.contains(&id(5)));
        assert_eq!(back.len(), 3);
        // No file: empty, and nothing to say.
        let (none, why) = DedupCache::load(&dir.path().join("absent"), "pool-a", 7, 10);
        assert!(none.is_empty() && why.is_none());
    }

    #[test]
    fn another_server_another_epoch_or_a_damaged_file_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dedup");
        let mut c = DedupCache::new("pool-a", 7, 100);
        c.insert(id(1));
        c.save(&path).unwrap();
        let (x, why) = DedupCache::load(&path, "pool-b", 7, 100);
        assert!(x.is_empty() && why.unwrap().contains("another server"));
        let (x, why) = DedupCache::load(&path, "pool-a", 8, 100);
        assert!(x.is_empty() && why.unwrap().contains("epoch 7, now 8"));
        let good = std::fs::read(&path).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x04;
            std::fs::write(&path, &bad).unwrap();
            let (x, why) = DedupCache::load(&path, "pool-a", 7, 100);
            assert!(x.is_empty() && why.is_some(), "byte {i}");
        }
        for len in 0..good.len() {
            std::fs::write(&path, &good[..len]).unwrap();
            let (x, why) = DedupCache::load(&path, "pool-a", 7, 100);
            assert!(x.is_empty() && why.is_some(), "length {len}");
        }
    }
}
