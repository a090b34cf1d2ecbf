//! Files only their owner may read (the node's key file, the journal, which names changed
//! files), and the owner-only directories they are made in: one way to make them, so none is
//! readable by others even for a moment.

use std::io::Write;
use std::path::Path;

use crate::error::{ClientError, Result, chain};

/// Makes the directory `path` is in, owner-only, when it is missing: what else it comes to
/// hold may be as private (`~/.config/qsm` holds the key file and `client.toml`, which may
/// name a password file). An existing directory is left as it is.
pub(crate) fn make_parent(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        qsm_types::durable::create_dir_all(dir, 0o700).map_err(ClientError::io("creating", dir))?;
    }
    Ok(())
}

/// `what` failed with `e`, for an error whose words do not fit [`ClientError::Io`].
fn failed(what: String, e: std::io::Error) -> ClientError {
    ClientError::Invalid(format!("{what}: {}", chain(&e)))
}

/// Writes `bytes` at `path`, mode 0600, so that a crash leaves the old file or the new one,
/// never half of one: a temporary file in the same directory, private before anything is
/// written into it, synced, renamed into place, and the directory synced; the temporary file
/// is removed if anything fails. A device or a FIFO at `path` is written in place, as the
/// CLI's other outputs are (renaming over it would replace it with a regular file).
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let private = || std::fs::Permissions::from_mode(0o600);
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(ClientError::io("cannot open", path))?;
        out.set_permissions(private())
            .map_err(|e| failed(format!("making {} private", path.display()), e))?;
        return out.write_all(bytes).map_err(ClientError::io("writing", path));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| ClientError::Invalid(format!("{} is not a file name", path.display())))?;
    let tmp = dir.join(format!(".{}.qsm-partial-{}", name.to_string_lossy(), std::process::id()));
    // Exclusive and owner-only: never through a file or symlink already at the name, never
    // readable by others. A leftover of this pid's earlier run (pids are reused) is removed
    // first.
    let _ = std::fs::remove_file(&tmp);
    let mut out = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().write(true).create_new(true),
        0o600,
    )
    .open(&tmp)
    .map_err(ClientError::io("cannot create", &tmp))?;
    let written = (|| {
        // Private before the key is written into it, whatever the umask made of the mode.
        out.set_permissions(private())
            .map_err(|e| failed(format!("making {} private", path.display()), e))?;
        out.write_all(bytes).map_err(ClientError::io("writing", path))?;
        out.sync_all().map_err(ClientError::io("syncing", path))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| failed(format!("renaming {} to {}", tmp.display(), path.display()), e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // The rename is durable only once the directory is synced.
    qsm_types::durable::sync_dir(dir).map_err(ClientError::io("syncing directory", dir))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_replaced_key_file_stays_private_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, b"before").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"after").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"after");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "a temporary file left");
    }
}
