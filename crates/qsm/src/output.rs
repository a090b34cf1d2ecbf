//! Where command output goes: a file that appears only when complete, or stdout.

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// An output that becomes visible under its name only once [`Output::commit`] succeeds: a file
/// is written to a temporary name in the same directory, synced, then renamed, so a failed or
/// interrupted run never leaves a file that looks complete.
pub enum Output {
    File { tmp: Option<PathBuf>, path: PathBuf, writer: BufWriter<File> },
    Stdout(BufWriter<io::Stdout>),
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
            return Ok(Output::Stdout(BufWriter::with_capacity(1 << 20, io::stdout())));
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
        // Exclusive and owner-only until the caller sets the final permissions: never through
        // a file or symlink already at the name, never readable by others meanwhile. A
        // leftover of this pid's earlier run (pids are reused) is removed first.
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

    /// Sets the permissions of the file being written (its temporary name, before anything
    /// is written, so it is never readable more widely); stdout and sinks have none to set.
    pub fn set_permissions(&self, perm: std::fs::Permissions) -> io::Result<()> {
        match self {
            Output::File { writer, .. } => writer.get_ref().set_permissions(perm),
            Output::Stdout(_) | Output::Discard(_) => Ok(()),
        }
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
                let dir = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                File::open(dir)
                    .and_then(|d| d.sync_all())
                    .with_context(|| format!("syncing directory {}", dir.display()))?;
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
