//! A restored file's way from its first quantum to its name, on the workers (issue 24).
//!
//! Creating a file, writing it, setting its metadata and renaming it into place is kernel
//! work, and on a disk most of a many-file restore's time. Done by the reading thread
//! (create) and the in-order writer (metadata, rename), it ran one file at a time; on the
//! workers it overlaps across cores. The first worker with data for a file makes its
//! temporary file, every worker writes its quanta at their offsets, and the worker that
//! writes the file's last quantum, whichever it is, finishes the file. The reading thread only
//! counts the quanta it hands out, so that worker can tell it wrote the last.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustix::fs::{AtFlags, FallocateFlags, Mode, OFlags};
use rustix::io::Errno;

use super::direct::{self, Buffer};
use super::{FileJob, into_place};
use crate::dirs::Dirs;
use crate::fsmeta::{self, At};

/// Files of at least this size are allocated whole before their quanta are written.
const PREALLOCATE_FROM: u64 = 1 << 20;

/// The worker side of one file of a restore (see the module comment).
#[derive(Debug, Default)]
pub(super) struct Target {
    state: Mutex<State>,
    /// Its writes go past the page cache ([`direct`]), until one cannot.
    direct: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Quanta the reader handed out, and how many there are once it handed out the last.
    sent: u64,
    total: Option<u64>,
    /// Quanta the workers are done with.
    written: u64,
    /// The temporary file and its directory, once made (or why they could not be).
    made: Option<Result<Made, String>>,
    /// The file cannot be restored, and why (the first reason).
    failed: Option<String>,
    /// Finished or abandoned: nothing more is done with it.
    closed: bool,
}

/// A file's temporary, open for writing, and its directory (where it is renamed).
type Made = (Arc<OwnedFd>, Arc<File>);

/// What became of a file, said by the worker that finished it.
#[derive(Debug)]
pub(super) enum Finished {
    Restored,
    Failed(String),
}

impl Target {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every change to the state is one assignment: a panicking holder leaves it valid.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The reader handed out a quantum of this file; `last`: the file has no more.
    pub(super) fn sent(&self, last: bool) {
        let mut s = self.state();
        s.sent += 1;
        if last {
            s.total = Some(s.sent);
        }
    }

    /// The temporary file to write the data into, made on first use: in its directory reached
    /// again from the target's descriptor (checked in the pre-pass, but it could have been
    /// swapped since), with `O_EXCL | O_NOFOLLOW`: never an existing file, never through a
    /// symlink, and nothing already there is removed.
    pub(super) fn file(&self, job: &FileJob, dirs: &Dirs) -> Result<Arc<File>, String> {
        let mut s = self.state();
        let made = s.made.get_or_insert_with(|| {
            let made = make(job, dirs);
            if let Ok((_, file)) = &made {
                let wanted = direct::wanted(&job.version.attrs);
                self.direct.store(wanted && direct::enable(file), Ordering::Release);
            }
            made
        });
        made.as_ref().map(|(_, file)| Arc::clone(file)).map_err(Clone::clone)
    }

    /// Writes a quantum's decoded data (`len` bytes of `buf`) at `offset` of the file's data:
    /// directly while the file's writes can be, else through the page cache.
    pub(super) fn write(
        &self,
        file: &File,
        buf: &mut Buffer,
        len: usize,
        offset: u64,
        job: &FileJob,
    ) -> std::io::Result<()> {
        let attrs = &job.version.attrs;
        if self.direct.load(Ordering::Acquire) {
            if direct::fits(offset, len, attrs.size) && direct::write(file, buf, len, offset)? {
                return Ok(());
            }
            // The flag off first, then the flag said off: a worker that sees it off writes
            // unaligned data through the page cache, which the flag would refuse.
            direct::disable(file);
            self.direct.store(false, Ordering::Release);
        }
        fsmeta::write_data(file, buf.data(len), offset, attrs.extents.as_deref())
    }

    /// A worker is done with a quantum of this file (`failed`: and the file cannot be restored).
    /// If it was the file's last quantum, the file is finished here, on this worker: its
    /// metadata set and its name taken, or its temporary removed; the outcome is returned.
    pub(super) fn written(
        &self,
        failed: Option<&str>,
        job: &FileJob,
        dirs: &Dirs,
        meta: &fsmeta::Context,
    ) -> Option<Finished> {
        let (made, failed) = {
            let mut s = self.state();
            s.written += 1;
            if let Some(why) = failed {
                s.failed.get_or_insert_with(|| why.to_owned());
            }
            if s.closed || s.total != Some(s.written) {
                return None;
            }
            s.closed = true;
            // An empty file has no data to make it on the way.
            if s.failed.is_none() && s.made.is_none() {
                s.made = Some(make(job, dirs));
            }
            (s.made.take(), s.failed.take())
        };
        let (parent, file) = match (made, failed) {
            (Some(Ok((parent, _))), Some(why)) => {
                let _ = rustix::fs::unlinkat(&*parent, job.tmp().as_str(), AtFlags::empty());
                return Some(Finished::Failed(why));
            }
            (_, Some(why)) | (Some(Err(why)), None) => return Some(Finished::Failed(why)),
            (Some(Ok(made)), None) => made,
            (None, None) => return Some(Finished::Failed("its file was never made".into())),
        };
        let v = &job.version;
        let mut problems = Vec::new();
        // A sparse file's length: its data ends before it when it ends in a hole; a file
        // that may have been written directly: its last block may have been padded.
        if (v.attrs.extents.is_some() || direct::wanted(&v.attrs))
            && let Err(e) = file.set_len(v.attrs.size)
        {
            problems.push(format!("length {} not set: {e}", v.attrs.size));
        }
        // Through the file handle, never the path (see `fsmeta::apply` for the order).
        problems.extend(fsmeta::apply(At::Fd(file.as_fd()), v.object_type, &v.attrs, meta));
        meta.note(&job.shown(dirs.shown()).display().to_string(), problems);
        drop(file);
        match into_place(&parent, &job.tmp(), job.name(), job.renamed.is_some()) {
            Ok(()) => {
                job.done.store(true, Ordering::Relaxed);
                Some(Finished::Restored)
            }
            Err(e) => {
                let _ = rustix::fs::unlinkat(&*parent, job.tmp().as_str(), AtFlags::empty());
                Some(Finished::Failed(format!("cannot rename into place: {e}")))
            }
        }
    }

    /// The restore stopped before this file was finished: its temporary, if made, is removed.
    pub(super) fn abandon(&self, job: &FileJob) {
        let mut s = self.state();
        if std::mem::replace(&mut s.closed, true) {
            return;
        }
        if let Some(Ok((parent, _))) = s.made.take() {
            let _ = rustix::fs::unlinkat(&*parent, job.tmp().as_str(), AtFlags::empty());
        }
    }
}

/// Makes `job`'s temporary file (see [`Target::file`]).
fn make(job: &FileJob, dirs: &Dirs) -> Result<Made, String> {
    let parent = dirs.get(&job.parents(), false)?;
    let flags = OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let tmp = job.tmp();
    let fd = rustix::fs::openat(&*parent, tmp.as_str(), flags, Mode::from_raw_mode(0o600))
        .map_err(|e| format!("cannot create {tmp}: {e}"))?;
    // A file of several quanta is written by all workers out of order: reserved whole first,
    // the file system lays it out in one piece instead of in the order the quanta land, and a
    // full disk is found before any of it is written. Not sparse files (their holes stay
    // holes), nor small ones (one write already allocates them at once).
    let size = job.version.attrs.size;
    if size >= PREALLOCATE_FROM && job.version.attrs.extents.is_none() {
        match rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, size) {
            Ok(()) => {}
            Err(e) if e == Errno::NOSPC || e == Errno::FBIG || e == Errno::DQUOT => {
                let _ = rustix::fs::unlinkat(&*parent, tmp.as_str(), AtFlags::empty());
                return Err(format!("cannot make room for {size} bytes: {e}"));
            }
            // Not every file system can (EOPNOTSUPP): then the writes allocate.
            Err(_) => {}
        }
    }
    Ok((parent, Arc::new(File::from(fd))))
}
