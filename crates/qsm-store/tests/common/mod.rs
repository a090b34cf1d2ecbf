//! Helpers shared by the store tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use qsm_catalog::{
    Attributes, Catalog, FilespaceId, NewObject, ObjectKind, ObjectType, SqliteCatalog,
};
use qsm_codec::{Compression, FrameEncoder};
use qsm_pool::{DirPool, DirPoolOptions, Pool};
use qsm_store::Store;

/// Opens (creating if new) a store with its catalog and pool under `dir`.
pub fn open_store(dir: &Path, target_size: Option<u64>) -> (Store, FilespaceId) {
    let catalog = SqliteCatalog::open(&dir.join("catalog.db")).unwrap();
    let pool_dir = dir.join("pool");
    let options = DirPoolOptions { target_size, fsync: true };
    let pool = if pool_dir.join("POOL").exists() {
        DirPool::open(&pool_dir).unwrap()
    } else {
        DirPool::create(&pool_dir, "main", &options).unwrap()
    };
    let fs = match catalog.node("alpha").unwrap() {
        Some(n) => catalog.filespace(n.id, "/data").unwrap(),
        None => {
            let d = catalog.define_domain("standard", "").unwrap();
            let n = catalog.register_node("alpha", "h", d).unwrap();
            catalog.filespace(n, "/data").unwrap()
        }
    };
    let catalog: Arc<dyn Catalog> = Arc::new(catalog);
    let pool: Arc<dyn Pool> = Arc::new(pool);
    (Store::new(catalog, pool, "test catalog").unwrap(), fs)
}

/// Deterministic, compressible-ish bytes.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if i % 3 == 0 { b'a' + (s % 7) as u8 } else { (s >> 32) as u8 }
        })
        .collect()
}

/// The frames of `bytes` cut into `quantum`-byte quanta.
pub fn frames(bytes: &[u8], quantum: usize) -> Vec<Vec<u8>> {
    let mut enc = FrameEncoder::new(Compression::parse("zstd:1").unwrap()).unwrap();
    bytes
        .chunks(quantum)
        .map(|q| {
            let mut out = Vec::new();
            let h = enc.encode(q, &mut out).unwrap();
            out.truncate(h.frame_len());
            out
        })
        .collect()
}

/// A backup version of `path` (chunks are filled in by the batch).
pub fn object(fs: FilespaceId, path: &str, size: usize) -> NewObject {
    NewObject {
        filespace: fs,
        path: path.as_bytes().to_vec(),
        kind: ObjectKind::Backup,
        object_type: ObjectType::File,
        attrs: Attributes { size: size as u64, mode: 0o100644, ..Attributes::default() },
        mgmt_class: None,
        description: None,
        retain_until: None,
        chunks: Vec::new(),
        replica: None,
    }
}

/// Adds `bytes` as object `path` to the batch.
pub fn add(batch: &mut qsm_store::Batch<'_>, fs: FilespaceId, path: &str, bytes: &[u8]) {
    let frames = frames(bytes, 16 * 1024);
    let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
    batch.add(object(fs, path, bytes.len()), &refs, 1_000).unwrap();
}

/// The restored bytes of object `id`.
pub fn restore(store: &Store, id: qsm_catalog::ObjectId) -> Vec<u8> {
    let mut out = Vec::new();
    store.restore(id, &mut out).unwrap();
    out
}
