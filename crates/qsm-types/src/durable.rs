//! Making names durable: a new file or directory survives a power cut only once the directory
//! that holds its name has been synced too (`fsync` of the file covers its data, not its
//! name). One implementation for every crate that creates what must survive: the pool's
//! containers, the catalog's database, the embedded store's home, catalog backups.

use std::fs::File;
use std::io;
use std::path::Path;

/// Syncs directory `dir`: the names created, renamed or removed in it become durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Syncs the directory holding `path` (`.` for a bare name).
pub fn sync_parent(path: &Path) -> io::Result<()> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    sync_dir(parent)
}

/// Creates `dir` and any missing parents with `mode`, each name made durable in its parent
/// before the next is made below it.
pub fn create_dir_all(dir: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_all(parent, mode)?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => sync_parent(dir),
        // Made meanwhile by another process, which syncs it.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_every_missing_level_and_accepts_an_existing_one() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_dir_all(&deep, 0o700).unwrap();
        assert!(deep.is_dir());
        create_dir_all(&deep, 0o700).unwrap();
        std::fs::write(dir.path().join("a/file"), b"x").unwrap();
        assert!(create_dir_all(&dir.path().join("a/file/d"), 0o700).is_err());
        sync_parent(&deep).unwrap();
    }
}
