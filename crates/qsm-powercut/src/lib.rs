//! A test file system that forgets: a FUSE passthrough over a backing directory that keeps
//! every change not yet covered by a sync volatile, and drops it on command, as a power cut
//! would. It also fails chosen reads, writes and syncs with the errno of your choice.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! use qsm_powercut::Forgetful;
//! # let (backing, mnt) = (std::path::Path::new("b"), std::path::Path::new("m"));
//! let fs = Forgetful::mount(backing, mnt)?;
//! // ... run the code under test against `mnt` ...
//! fs.cut_now();
//! let lost = fs.reboot()?; // `backing` now holds what the disk would after the power came back
//! # let _ = lost; Ok(()) }
//! ```
//!
//! # The model
//!
//! Every request is applied to the backing directory at once (reads see the latest data,
//! as they would through a page cache); beside it the file system keeps an undo record of
//! whatever is not durable yet. [`Forgetful::reboot`] unmounts and applies the undo
//! records, newest first, so the backing directory is left as the disk would be.
//!
//! **Data.** A write, truncate or fallocate of a file saves, the first time each 4 KiB page
//! is touched since the file's last sync, the page's bytes below the file's durable size
//! (bytes past that size need no saving: the reboot truncates them away). `fsync` and
//! `fdatasync` of the file (through any descriptor) make its current bytes and size
//! durable: the saved pages are dropped. Nothing else does: not `close`, not `sync(2)` or
//! `syncfs`, not a directory fsync. At reboot every file's saved pages are written back and
//! it is cut to its durable size.
//!
//! **Torn writes.** With [`Forgetful::set_tear`], the last data write of all (if its file
//! was not synced or truncated after it) is not dropped whole: the pages of its beginning
//! up to its last page boundary are kept, the rest reverts. A write that crosses no page
//! boundary is dropped whole. Keeping a later write while dropping earlier ones is a
//! possible crash state, since a disk writes back its cache in any order.
//!
//! **Names.** create, mkdir, mknod, symlink, link, unlink, rmdir and rename each record
//! how to undo them. Unlinked, removed and replaced entries are moved into a hidden stash
//! directory in the backing root (invisible through the mount), so they can come back; an
//! open descriptor of an unlinked file keeps working. A record becomes durable when its
//! parent directory is fsynced (`open(O_RDONLY|O_DIRECTORY)` + `fsync`); a rename needs
//! both parents. A file's own fsync does not make its name durable: a created file whose
//! directory was not synced is gone after the reboot even if its data was synced. Undoing
//! the creation of a directory removes it with whatever it holds. At reboot, pending
//! records are undone newest first, then the stash is emptied.
//!
//! **Metadata** (chmod, chown, utimens) is applied and counted durable at once: QSM's
//! correctness never rests on it. Extended attributes are not supported (`EOPNOTSUPP`);
//! `RENAME_EXCHANGE` and `RENAME_WHITEOUT` fail with `EINVAL`. POSIX locks are left to the
//! kernel, which handles them locally for the mount: right for tests in one process (or
//! several processes on one machine), which is what a FUSE mount can see anyway.
//!
//! **The power cut.** [`Forgetful::cut_at_sync`] chooses the n-th sync call from now
//! (fsync, fdatasync or directory fsync): that call fails with `EIO` and makes nothing
//! durable, and from then on every request fails with `EIO`, except reads of files already
//! open: they return what the backing holds, since a failed read of a mapped file (SQLite's
//! `-shm`) would kill the test process with SIGBUS while its own file system is mounted.
//! [`Forgetful::cut_now`] cuts at once. [`Forgetful::syncs`] counts sync calls so a
//! harness can run a scenario once, count its syncs, then cut at each in turn.
//!
//! **Failed syncs (fsyncgate).** An injected sync failure ([`Fault`] with [`Op::Sync`]) on a
//! file loses every data change made to it since its last successful sync, whatever
//! happens later, as Linux does when writeback fails and the page is marked clean anyway:
//! after the reboot those bytes read as they were at the last successful sync, and bytes
//! the file grew by read as zeros. The file's size at the failure is kept. Exception: a
//! page written again after the failure and then synced successfully holds what it held at
//! that sync (the kernel writes back the whole page, failed bytes included). A failed
//! directory sync makes nothing durable and loses nothing; a later successful one does.
//!
//! **What is not simulated.** Kernel page-cache effects other than the above (the kernel
//! does not cache reads: files are opened in direct-I/O mode when the kernel allows mmap of
//! such files, as Linux 6.6 and later do); reordering of namespace operations within one
//! directory (a directory fsync makes all of them durable together, as a journal would);
//! journaling file systems that commit every earlier metadata change with any fsync (this
//! model is the stricter POSIX one); partial sector writes; the real durability of the
//! backing directory (nothing is ever synced on it: the model is the disk).

mod fs;
mod model;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fuser::{BackgroundSession, Config, MountOption};

use crate::fs::{Fs, Shared};
use crate::model::State;

/// The operations a [`Fault`] can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A read of file data.
    Read,
    /// A write or fallocate of file data.
    Write,
    /// fsync, fdatasync, or fsync of a directory.
    Sync,
}

/// A failure to inject: the `nth` (1-based; 0 counts as 1) request of kind `op` whose path
/// (relative to the mount root) contains `path_contains` fails with `errno`, once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub op: Op,
    /// The errno to return, e.g. `libc::EIO` or `libc::ENOSPC`.
    pub errno: i32,
    /// Only requests on a path containing this string match; `None` matches any.
    pub path_contains: Option<String>,
    pub nth: u64,
}

/// The last data write, torn at a page boundary by the reboot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Torn {
    /// The file's path relative to the mount root at the power cut.
    pub path: PathBuf,
    pub offset: u64,
    /// The length of the write.
    pub len: u64,
    /// How many bytes of its beginning survived.
    pub kept: u64,
}

/// What a reboot dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lost {
    /// Data changes (writes, truncates, fallocates) that did not become durable, including
    /// those lost to a failed sync.
    pub writes: u64,
    /// Bytes carried by those writes.
    pub bytes: u64,
    /// Creations, removals, renames and links undone.
    pub namespace_ops: u64,
    /// The write torn rather than dropped, when tearing was on and one could be torn.
    pub torn: Option<Torn>,
}

/// Why this machine cannot mount a [`Forgetful`], or `None` if it can: mounting needs root
/// and `/dev/fuse`. Tests use it to skip with a reason.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("mounting FUSE needs root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    None
}

/// A mounted forgetful file system. Dropping it unmounts without reverting anything.
pub struct Forgetful {
    shared: Arc<Shared>,
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    backing: PathBuf,
}

impl fmt::Debug for Forgetful {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Forgetful")
            .field("backing", &self.backing)
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

impl Forgetful {
    /// Mounts a forgetful view of `backing` (an existing directory, whose present content
    /// counts as durable) at `mountpoint` (an existing empty directory), served by a
    /// background thread. A stash left in `backing` by a process that died mounted is
    /// deleted.
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<Forgetful> {
        let backing = backing.canonicalize()?;
        let mountpoint = mountpoint.canonicalize()?;
        if mountpoint.starts_with(&backing) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "mountpoint {} is inside backing {}",
                    mountpoint.display(),
                    backing.display()
                ),
            ));
        }
        let shared = Arc::new(Shared { state: Mutex::new(State::new(backing.clone())?) });
        let mut config = Config::default();
        config.mount_options =
            vec![MountOption::FSName("qsm-powercut".into()), MountOption::DefaultPermissions];
        let session = fuser::spawn_mount2(Fs(shared.clone()), &mountpoint, &config)?;
        Ok(Forgetful { shared, session: Some(session), mountpoint, backing })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// The power fails at the `n`-th sync call from now (1 = the next); 0 cuts now.
    pub fn cut_at_sync(&self, n: u64) {
        let mut st = self.shared.lock();
        if n == 0 {
            st.cut = true;
        } else {
            st.cut_at = Some(st.syncs + n);
        }
    }

    /// The power fails now: every request from now on fails with `EIO`.
    pub fn cut_now(&self) {
        self.shared.lock().cut = true;
    }

    pub fn is_cut(&self) -> bool {
        self.shared.lock().cut
    }

    /// Sync calls seen so far (fsync, fdatasync, directory fsync), failed ones included.
    pub fn syncs(&self) -> u64 {
        self.shared.lock().syncs
    }

    /// Whether the reboot tears the last unsynced write at a page boundary instead of
    /// dropping it whole (off by default).
    pub fn set_tear(&self, on: bool) {
        self.shared.lock().tear = on;
    }

    /// Arms a fault; it fires once.
    pub fn inject(&self, fault: Fault) {
        self.shared.lock().arm(fault);
    }

    /// Unmounts, then reverts the backing directory to what a machine would find after the
    /// power came back, and says what was dropped. Cuts the power first if it was not cut.
    pub fn reboot(mut self) -> io::Result<Lost> {
        self.shared.lock().cut = true;
        self.unmount()?;
        self.shared.lock().revert()
    }

    /// Unmounts and waits for the session thread. Retries while the mount is busy, then
    /// detaches it lazily: a descriptor the code under test leaked must not wedge the test.
    fn unmount(&mut self) -> io::Result<()> {
        use nix::errno::Errno;
        use nix::mount::{MntFlags, umount2};
        let Some(session) = self.session.take() else { return Ok(()) };
        // Closing a file releases the mount at once, so a mount still busy after a second
        // has a descriptor (or a working directory) that will not go away by itself.
        let deadline = Instant::now() + Duration::from_secs(1);
        let (result, lazy) = loop {
            match umount2(&self.mountpoint, MntFlags::empty()) {
                Ok(()) => break (Ok(()), false),
                Err(Errno::EBUSY) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(10));
                }
                Err(Errno::EBUSY) => {
                    let res = umount2(&self.mountpoint, MntFlags::MNT_DETACH);
                    break (res.map_err(io::Error::from), true);
                }
                Err(e) => break (Err(io::Error::from(e)), false),
            }
        };
        // Requests from descriptors that outlive a lazy unmount must not touch the backing
        // dir while it is reverted: from here on every request fails.
        self.shared.lock().dead = true;
        // After a clean unmount the kernel ends the session at once; after a lazy one only
        // when the last descriptor closes, which may be never: then leave the thread be.
        let wait = if lazy { Duration::from_millis(100) } else { Duration::from_secs(5) };
        let deadline = Instant::now() + wait;
        while !session.guard.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(2));
        }
        if session.guard.is_finished() {
            // The session's own unmount finds nothing mounted; its error, if any, is moot.
            let _ = session.join();
        }
        result
    }
}

impl Drop for Forgetful {
    fn drop(&mut self) {
        let _ = self.unmount();
    }
}
