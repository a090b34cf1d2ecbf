//! `qsm restore --tar`: what a restore selects, as a POSIX tar stream (pax), to pipe to another
//! machine or keep as a file. Entries are named by their path below the filespace root (the
//! root itself is `.`), with their mode, owner, group and nanosecond mtime; symlinks, hard
//! links, FIFOs and devices as themselves; extended attributes (ACLs among them, as their
//! `system.posix_acl_*` attributes) as `SCHILY.xattr.*` records, which GNU tar and bsdtar
//! restore with `--xattrs`; names and link targets of any length or encoding in pax records.
//! A sparse file's holes are written as zeros.
//!
//! The `tar` crate encodes the headers; the data is streamed through [`crate::restore::Sink`]
//! as the restore decodes it, never held whole.

use std::io::{self, Write};

use qsm_types::model::{ObjectType, ObjectVersion};
use tar::{EntryType, Header};

use crate::restore::Sink;

/// Writes a tar stream into `out`; [`TarSink::finish`] ends it.
#[derive(Debug)]
pub struct TarSink<W: Write> {
    out: W,
    /// Bytes of the current file still due.
    due: u64,
    /// Bytes of the current file written.
    written: u64,
}

const BLOCK: usize = 512;

impl<W: Write> TarSink<W> {
    pub fn new(out: W) -> TarSink<W> {
        TarSink { out, due: 0, written: 0 }
    }

    /// Writes the end-of-archive marker and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(&[0; 2 * BLOCK])?;
        self.out.flush()?;
        Ok(self.out)
    }

    /// Zeros up to the next block boundary after `len` bytes.
    fn pad(&mut self, len: u64) -> io::Result<()> {
        let rest = (BLOCK - (len % BLOCK as u64) as usize) % BLOCK;
        self.out.write_all(&[0; BLOCK][..rest])
    }

    /// A pax extended header carrying `records`, before the entry they describe.
    fn pax(&mut self, records: &[(String, Vec<u8>)]) -> io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut body = Vec::new();
        for (key, value) in records {
            body.extend_from_slice(&pax_record(key, value));
        }
        let mut h = Header::new_ustar();
        h.set_path("././@PaxHeader")?;
        h.set_entry_type(EntryType::XHeader);
        h.set_mode(0o644);
        h.set_size(body.len() as u64);
        h.set_mtime(0);
        h.set_cksum();
        self.out.write_all(h.as_bytes())?;
        self.out.write_all(&body)?;
        self.pad(body.len() as u64)
    }
}

/// One pax record, `LEN KEY=VALUE\n`, where LEN counts the whole record, its own digits too.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = rest + 1;
    while len.to_string().len() + rest != len {
        len = len.to_string().len() + rest;
    }
    let mut out = format!("{len} {key}=").into_bytes();
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

/// The entry's name: its path below the filespace root (`.` for the root), directories
/// ending in `/`.
fn entry_name(v: &ObjectVersion) -> Vec<u8> {
    let mut name = if v.path.is_empty() { b".".to_vec() } else { v.path.clone() };
    if v.object_type == ObjectType::Directory {
        name.push(b'/');
    }
    name
}

/// Whether `bytes` fit a ustar name field of `max` bytes as they are.
fn fits(bytes: &[u8], max: usize) -> bool {
    bytes.len() <= max && std::str::from_utf8(bytes).is_ok() && !bytes.contains(&0)
}

impl<W: Write> Sink for TarSink<W> {
    fn begin(&mut self, v: &ObjectVersion) -> io::Result<()> {
        let a = &v.attrs;
        let mut h = Header::new_ustar();
        let (kind, size) = match v.object_type {
            ObjectType::File => (EntryType::Regular, a.size),
            ObjectType::Directory => (EntryType::Directory, 0),
            ObjectType::Symlink => (EntryType::Symlink, 0),
            ObjectType::Hardlink => (EntryType::Link, 0),
            ObjectType::Fifo => (EntryType::Fifo, 0),
            ObjectType::CharDevice => (EntryType::Char, 0),
            ObjectType::BlockDevice => (EntryType::Block, 0),
        };
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(a.mode & 0o7777);
        h.set_uid(u64::from(a.uid));
        h.set_gid(u64::from(a.gid));
        h.set_mtime(u64::try_from(a.mtime_ns.div_euclid(1_000_000_000)).unwrap_or(0));
        if matches!(kind, EntryType::Char | EntryType::Block) {
            // Linux's encoding of a device number (glibc's gnu_dev_major / gnu_dev_minor).
            let major = ((a.rdev >> 8) & 0xfff) | ((a.rdev >> 32) & !0xfff);
            let minor = (a.rdev & 0xff) | ((a.rdev >> 12) & !0xff);
            h.set_device_major(u32::try_from(major).unwrap_or(0))?;
            h.set_device_minor(u32::try_from(minor).unwrap_or(0))?;
        }
        let mut records: Vec<(String, Vec<u8>)> = Vec::new();
        let name = entry_name(v);
        if fits(&name, 100) {
            h.set_path(std::str::from_utf8(&name).map_err(io::Error::other)?)?;
        } else {
            // Any length, any bytes: the pax `path` record (raw bytes, said so).
            if std::str::from_utf8(&name).is_err() {
                records.push(("hdrcharset".into(), b"BINARY".to_vec()));
            }
            records.push(("path".into(), name.clone()));
            h.set_path("././@LongName")?;
        }
        if let Some(target) = a
            .link_target
            .as_deref()
            .filter(|_| matches!(kind, EntryType::Symlink | EntryType::Link))
        {
            if fits(target, 100) {
                h.set_link_name(std::str::from_utf8(target).map_err(io::Error::other)?)?;
            } else {
                records.push(("linkpath".into(), target.to_vec()));
            }
        }
        let nanos = a.mtime_ns.rem_euclid(1_000_000_000);
        if nanos != 0 {
            let secs = a.mtime_ns.div_euclid(1_000_000_000);
            records.push(("mtime".into(), format!("{secs}.{nanos:09}").into_bytes()));
        }
        for (key, value) in &a.xattrs {
            let key = String::from_utf8_lossy(key);
            records.push((format!("SCHILY.xattr.{key}"), value.clone()));
        }
        self.pax(&records)?;
        h.set_cksum();
        self.out.write_all(h.as_bytes())?;
        self.due = size;
        self.written = 0;
        Ok(())
    }

    fn data(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.written += bytes.len() as u64;
        if self.written > self.due {
            return Err(io::Error::other("more data than the file's size"));
        }
        self.out.write_all(bytes)
    }

    fn end(&mut self, v: &ObjectVersion) -> io::Result<()> {
        if self.written != self.due {
            return Err(io::Error::other(format!(
                "{}: {} bytes written of {}",
                String::from_utf8_lossy(&v.path),
                self.written,
                self.due
            )));
        }
        let len = self.written;
        (self.due, self.written) = (0, 0);
        self.pad(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_count_their_own_length() {
        for value in [&b"x"[..], &[b'y'; 5][..], &[b'z'; 89][..], &[b'w'; 994][..]] {
            let r = pax_record("path", value);
            let (len, _) = std::str::from_utf8(&r[..r.iter().position(|&b| b == b' ').unwrap()])
                .map(|s| (s.parse::<usize>().unwrap(), ()))
                .unwrap();
            assert_eq!(len, r.len(), "{}", String::from_utf8_lossy(&r));
            assert!(r.ends_with(b"\n"));
        }
    }
}
