//! Large files written past the page cache, with `O_DIRECT` (issue 24).
//!
//! Restoring 2 GiB of large files, the kernel's copy of each decoded quantum into the page
//! cache cost as much CPU as decoding it, on the same cores, and on this project's VMs it
//! swung from 0.8 s to 5 s for the same bytes (docs/PERFORMANCE.md section 17.1). A direct
//! write hands the worker's buffer to the disk instead: no copy, no page cache to fill and
//! write back, and the data is on the disk when the write returns. Small files keep the page
//! cache: a direct write waits for the disk, which one buffered write of a small file does not.
//!
//! A direct write needs its buffer, file offset and length aligned. Decoded quanta sit in
//! aligned buffers ([`Buffer`]); a file's quanta start at multiples of the quantum size, and
//! its last one is written padded with zeros, the file cut back to its length when finished.
//! Anything else (a deduplicated file's chunks start anywhere, a file system that refuses)
//! sends that file's remaining writes through the page cache: never an error of its own.

use std::fs::File;
use std::os::unix::fs::FileExt;

use rustix::fs::OFlags;
use rustix::io::Errno;

/// The alignment direct writes get: the page size, which covers the 512-byte and 4 KiB
/// logical blocks of today's disks.
pub(super) const ALIGN: usize = 4096;

/// Files of at least this size are written directly: several quanta, each a large write.
const DIRECT_FROM: u64 = 8 << 20;

/// Whether a file is to be written directly where its file system allows: large, and not
/// sparse (a sparse file's data runs through its extents, not at its own offsets).
pub(super) fn wanted(attrs: &qsm_types::model::Attributes) -> bool {
    attrs.size >= DIRECT_FROM && attrs.extents.is_none()
}

/// File systems of local disks, where a direct write goes to the disk as it is (statfs magic
/// numbers, linux/magic.h): ext2-4, XFS, Btrfs, F2FS. Not network or FUSE file systems,
/// where each direct write is a synchronous round trip and the page cache's write-behind is
/// the faster way, nor tmpfs, which has no disk to go past the cache to.
const LOCAL_DISK: [u32; 4] = [0xEF53, 0x5846_5342, 0x9123_683E, 0xF2F5_2010];

/// Turns direct writes on for `file`; `false` where its file system is not a local disk's
/// or refuses them.
pub(super) fn enable(file: &File) -> bool {
    // The magic number is a u32 in a field whose width varies by architecture.
    #[allow(clippy::cast_possible_truncation, clippy::unnecessary_cast)]
    let local = rustix::fs::fstatfs(file).is_ok_and(|s| LOCAL_DISK.contains(&(s.f_type as u32)));
    local
        && rustix::fs::fcntl_getfl(file)
            .and_then(|flags| rustix::fs::fcntl_setfl(file, flags | OFlags::DIRECT))
            .is_ok()
}

/// Sends `file`'s further writes through the page cache. A direct write still under way on
/// another worker is unaffected: either way its bytes land where they should.
pub(super) fn disable(file: &File) {
    let _ = rustix::fs::fcntl_getfl(file)
        .and_then(|flags| rustix::fs::fcntl_setfl(file, flags - OFlags::DIRECT));
}

/// Whether a quantum of `len` bytes at `offset` of a file of `size` bytes can be written
/// directly: it starts on a boundary and ends on one, or ends the file (then it is padded).
pub(super) fn fits(offset: u64, len: usize, size: u64) -> bool {
    offset.is_multiple_of(ALIGN as u64)
        && (len.is_multiple_of(ALIGN) || offset.checked_add(len as u64) == Some(size))
}

/// Writes `buf`'s first `len` bytes at `offset` directly, padded with zeros to the alignment.
/// `Ok(false)`: the file system refused the direct write (`EINVAL`), nothing was lost, and the
/// caller writes them through the page cache.
pub(super) fn write(
    file: &File,
    buf: &mut Buffer,
    len: usize,
    offset: u64,
) -> std::io::Result<bool> {
    match file.write_all_at(buf.padded(len), offset) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A worker's buffer for one decoded quantum, starting at an [`ALIGN`]ed address so that it
/// can be written directly. Safe code only: the vector is over-allocated and used from its
/// first aligned byte.
#[derive(Debug, Default)]
pub(super) struct Buffer {
    buf: Vec<u8>,
    start: usize,
}

impl Buffer {
    /// Room for `len` bytes at an aligned address, for the decoder to fill.
    pub(super) fn room(&mut self, len: usize) -> &mut [u8] {
        let padded = len.next_multiple_of(ALIGN);
        if self.buf.len() < padded + ALIGN {
            self.buf = vec![0; padded + ALIGN];
        }
        self.start = (ALIGN - self.buf.as_ptr().addr() % ALIGN) % ALIGN;
        &mut self.buf[self.start..self.start + padded]
    }

    /// The first `len` bytes of what [`Buffer::room`] gave.
    pub(super) fn data(&self, len: usize) -> &[u8] {
        &self.buf[self.start..self.start + len]
    }

    /// The first `len` bytes followed by zeros up to the alignment: the padding must not carry
    /// an earlier quantum's bytes (of another file, perhaps) past the end of this one, even
    /// for the moment before the file is cut to its length.
    fn padded(&mut self, len: usize) -> &[u8] {
        let end = self.start + len.next_multiple_of(ALIGN);
        self.buf[self.start + len..end].fill(0);
        &self.buf[self.start..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_is_aligned_and_padded_with_zeros() {
        let mut b = Buffer::default();
        for len in [1, 4095, 4096, 4097, 1 << 20, 100] {
            let room = b.room(len);
            assert_eq!(room.as_ptr().addr() % ALIGN, 0);
            assert_eq!(room.len(), len.next_multiple_of(ALIGN));
            room.fill(0xAB);
            assert!(b.data(len).iter().all(|&x| x == 0xAB));
            let padded = b.padded(len);
            assert_eq!(padded.len(), len.next_multiple_of(ALIGN));
            assert!(padded[len..].iter().all(|&x| x == 0), "padding of {len}");
        }
    }

    #[test]
    fn only_aligned_quanta_or_the_last_fit() {
        let m = 1 << 20;
        assert!(fits(0, m, 10 * m as u64));
        assert!(fits(9 * m as u64, m, 10 * m as u64));
        assert!(fits(9 * m as u64, 123, 9 * m as u64 + 123), "the last quantum, padded");
        assert!(!fits(8 * m as u64, 123, 9 * m as u64), "short in the middle");
        assert!(!fits(100, m, 10 * m as u64), "a chunk that starts anywhere");
    }

    #[test]
    fn a_direct_write_lands_whole_or_is_refused_without_loss() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut options = File::options();
        let file = options.create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        let direct = enable(&file);
        let mut b = Buffer::default();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        b.room(data.len())[..data.len()].copy_from_slice(&data);
        // A file system without direct writes (a tmpfs on older kernels) refuses the flag;
        // where it took it, the write goes through or says it must be buffered.
        let wrote = write(&file, &mut b, data.len(), 0).unwrap();
        if !wrote {
            disable(&file);
            file.write_all_at(b.data(data.len()), 0).unwrap();
        }
        file.set_len(data.len() as u64).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data, "direct {direct}, wrote {wrote}");
    }
}
