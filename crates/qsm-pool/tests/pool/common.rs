//! Helpers shared by the test modules.

use std::path::Path;

use qsm_codec::Compression;
use qsm_pool::conformance::{encode, text_data};
use qsm_pool::{ContainerId, DirPool, DirPoolOptions, FrameLocation, Pool};

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A new pool in `dir/pool` with fsync on and the given target size.
pub fn new_pool(dir: &Path, target_size: Option<u64>) -> Result<DirPool, qsm_pool::PoolError> {
    let options = DirPoolOptions { target_size, ..DirPoolOptions::default() };
    DirPool::create(dir.join("pool"), "test", &options)
}

/// Frames of compressible text, `n` of them, about 4 KiB of data each.
pub fn text_frames(n: usize, seed: u64) -> Result<Vec<Vec<u8>>, Box<dyn std::error::Error>> {
    (0..n)
        .map(|i| Ok(encode(Compression::AUTO, &text_data(4_000 + 37 * i, seed + i as u64))?))
        .collect()
}

/// Writes `frames` to one new container and syncs; seals it if `seal`, else drops the writer
/// (leaving the container unsealed, as a crash after the sync would).
pub fn write_container(
    pool: &DirPool,
    frames: &[Vec<u8>],
    seal: bool,
) -> Result<(ContainerId, Vec<FrameLocation>), Box<dyn std::error::Error>> {
    let mut w = pool.writer()?;
    let id = w.container();
    let locs = frames.iter().map(|f| w.append(f)).collect::<Result<Vec<_>, _>>()?;
    w.sync()?;
    if seal {
        w.finish()?;
    }
    Ok((id, locs))
}

/// XORs `mask` into the byte at `offset` of `path`.
pub fn flip(path: &Path, offset: u64, mask: u8) -> std::io::Result<()> {
    let mut bytes = std::fs::read(path)?;
    let at = usize::try_from(offset).map_err(std::io::Error::other)?;
    let b = bytes.get_mut(at).ok_or_else(|| std::io::Error::other("offset past the end"))?;
    *b ^= mask;
    std::fs::write(path, bytes)
}

/// Cuts `path` to `len` bytes.
pub fn truncate(path: &Path, len: u64) -> std::io::Result<()> {
    std::fs::OpenOptions::new().write(true).open(path)?.set_len(len)
}
