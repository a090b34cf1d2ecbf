//! Where command output goes: a file that appears only when complete, or stdout.
//!
//! Stdout may be closed by its reader before the command ends (`qsm query backup | head -1`).
//! That is no error of the command's, and must not panic as `println!` does: a report or
//! listing printed with [`outln!`] just stops being written, and the command still does all
//! it was asked (a backup of several paths is not cut short) and exits as it would have; a
//! data stream ([`Output::open`] without a file) ends the command at once, exit 0, as a filter
//! whose reader has gone should. Any other failure to write stdout (a full disk) is said once
//! and makes the command exit 1 ([`failure`]). SIGPIPE's default action is not restored
//! instead: it would end a backup mid-transaction at its first summary line, and kill the
//! process on a write to a closed local socket as well.

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};

/// `println!` for command output: see the module's documentation.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}

/// `eprintln!` for warnings and errors: a closed stderr (`qsm backup 2>&1 | head`) loses the
/// message instead of panicking in the middle of the work.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::err_line(format_args!($($arg)*))
    };
}

/// Set once stdout can take no more: its reader has gone, or writing it failed.
static STDOUT_DONE: AtomicBool = AtomicBool::new(false);
/// Why writing stdout failed, when its reader had not simply gone.
static STDOUT_FAILED: OnceLock<String> = OnceLock::new();

/// Writes one line of command output (what [`outln!`] expands to).
pub fn line(args: std::fmt::Arguments<'_>) {
    if STDOUT_DONE.load(Ordering::Relaxed) {
        return;
    }
    if let Err(e) = io::stdout().lock().write_fmt(format_args!("{args}\n")) {
        stdout_failed(&e);
    }
}

/// Writes one line to stderr (what [`errln!`] expands to); a failure is dropped, since there
/// is nowhere left to say it.
pub fn err_line(args: std::fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(format_args!("{args}\n"));
}

/// Records that writing stdout failed with `e`: no more is written to it.
fn stdout_failed(e: &io::Error) {
    STDOUT_DONE.store(true, Ordering::Relaxed);
    if e.kind() != io::ErrorKind::BrokenPipe {
        let _ = STDOUT_FAILED.set(e.to_string());
    }
}

/// Why the command's output is incomplete, if writing stdout failed otherwise than by its
/// reader going away.
pub fn failure() -> Option<&'static str> {
    STDOUT_FAILED.get().map(String::as_str)
}

/// The error a data stream to stdout ends with when its reader has gone.
#[derive(Debug)]
struct ReaderGone;

impl std::fmt::Display for ReaderGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the reader of stdout has gone")
    }
}

impl std::error::Error for ReaderGone {}

/// Whether `e` is a data stream's end because the reader of stdout has gone: not a failure.
pub fn reader_gone(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
            .is_some_and(|inner| inner.is::<ReaderGone>())
    })
}

/// Stdout for data streams: a closed pipe becomes [`ReaderGone`], whatever layer (buffer,
/// codec) the error then passes through.
#[derive(Debug)]
pub struct Stdout(io::Stdout);

impl Stdout {
    fn checked<T>(done: io::Result<T>) -> io::Result<T> {
        done.map_err(|e| {
            stdout_failed(&e);
            if e.kind() == io::ErrorKind::BrokenPipe {
                io::Error::new(io::ErrorKind::BrokenPipe, ReaderGone)
            } else {
                e
            }
        })
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Self::checked(self.0.write(buf))
    }
    fn flush(&mut self) -> io::Result<()> {
        Self::checked(self.0.flush())
    }
}

/// An output that becomes visible under its name only once [`Output::commit`] succeeds: a file
/// is written to a temporary name in the same directory, synced, then renamed, so a failed or
/// interrupted run never leaves a file that looks complete.
pub enum Output {
    File { tmp: Option<PathBuf>, path: PathBuf, writer: BufWriter<File> },
    Stdout(BufWriter<Stdout>),
    Discard(io::Sink),
}

impl Output {
    /// Opens `path`, or stdout when `None`. `binary` refuses to write to a terminal.
    pub fn open(path: Option<&Path>, force: bool, binary: bool) -> Result<Output> {
        let Some(path) = path else {
            if binary && io::stdout().is_terminal() {
                bail!(
                    "refusing to write compressed data to a terminal; use -o FILE or redirect stdout"
                );
            }
            return Ok(Output::Stdout(BufWriter::with_capacity(1 << 20, Stdout(io::stdout()))));
        };
        if path.exists() && !force {
            bail!("{} already exists; use --force to overwrite it", path.display());
        }
        // A device or FIFO (`-o /dev/null`) is written in place: renaming over it would replace
        // the device with a regular file.
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            return Ok(Output::File {
                tmp: None,
                path: path.to_path_buf(),
                writer: BufWriter::with_capacity(1 << 20, file),
            });
        }
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name =
            path.file_name().with_context(|| format!("{} is not a file name", path.display()))?;
        let tmp =
            dir.join(format!(".{}.qsm-partial-{}", name.to_string_lossy(), std::process::id()));
        // Exclusive and owner-only: never through a file or symlink already at the name, never
        // readable by others. A leftover of this pid's earlier run (pids are reused) is
        // removed first.
        let _ = std::fs::remove_file(&tmp);
        let file = std::os::unix::fs::OpenOptionsExt::mode(
            std::fs::OpenOptions::new().write(true).create_new(true),
            0o600,
        )
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
        Ok(Output::File {
            tmp: Some(tmp),
            path: path.to_path_buf(),
            writer: BufWriter::with_capacity(1 << 20, file),
        })
    }

    /// A sink that verifies without writing (`--test`).
    pub fn discard() -> Output {
        Output::Discard(io::sink())
    }

    /// Flushes, syncs and renames the file into place.
    pub fn commit(mut self) -> Result<()> {
        match &mut self {
            Output::File { tmp, path, writer } => {
                writer.flush().with_context(|| format!("writing {}", path.display()))?;
                let Some(tmp_path) = tmp.take() else {
                    return Ok(()); // written in place: a device or FIFO
                };
                writer
                    .get_ref()
                    .sync_all()
                    .with_context(|| format!("syncing {}", path.display()))?;
                std::fs::rename(&tmp_path, &*path).with_context(|| {
                    format!("renaming {} to {}", tmp_path.display(), path.display())
                })?;
                // The rename is durable only once the directory is synced.
                qsm_types::durable::sync_parent(path)
                    .with_context(|| format!("syncing the directory of {}", path.display()))?;
                Ok(())
            }
            Output::Stdout(w) => w.flush().context("writing stdout"),
            Output::Discard(_) => Ok(()),
        }
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let Output::File { tmp: Some(tmp), .. } = self {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Output::File { writer, .. } => writer.write(buf),
            Output::Stdout(w) => w.write(buf),
            Output::Discard(s) => s.write(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Output::File { writer, .. } => writer.write_all(buf),
            Output::Stdout(w) => w.write_all(buf),
            Output::Discard(s) => s.write_all(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::File { writer, .. } => writer.flush(),
            Output::Stdout(w) => w.flush(),
            Output::Discard(_) => Ok(()),
        }
    }
}
