// The fidelity suite of issue 22, shared by the embedded tests (backup.rs) and the network
// suite (suite/network.rs): a tree holding every kind of metadata QSM keeps, a manifest of
// it taken before backup and after restore, and the comparison. Included with `include!`, so
// it names everything it uses in full.

/// One entry of a tree as the file system holds it, in the terms a restore must reproduce.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ManifestEntry {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime_ns: i64,
    rdev: u64,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Regular files: BLAKE3 of the content. Symlinks: the target.
    content: Vec<u8>,
    /// Regular files with several names: the first name of the group in path order.
    link_group: Option<Vec<u8>>,
    /// Files on fewer blocks than their size (sparse): the blocks they occupy.
    sparse_blocks: Option<u64>,
}

/// Every entry below `root` (the root itself as ""), by relative path as bytes. Sockets are
/// left out: they are not backed up, by design.
fn manifest(root: &std::path::Path) -> std::collections::BTreeMap<Vec<u8>, ManifestEntry> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = std::collections::BTreeMap::new();
    let mut groups: std::collections::HashMap<u64, Vec<u8>> = std::collections::HashMap::new();
    let mut paths = vec![Vec::new()];
    let mut stack = vec![Vec::<u8>::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(std::ffi::OsStr::from_bytes(&rel));
        for e in std::fs::read_dir(&dir).unwrap() {
            let name = e.unwrap().file_name();
            let mut child = rel.clone();
            if !child.is_empty() {
                child.push(b'/');
            }
            child.extend_from_slice(name.as_bytes());
            if std::fs::symlink_metadata(dir.join(&name)).unwrap().is_dir() {
                stack.push(child.clone());
            }
            paths.push(child);
        }
    }
    paths.sort();
    for rel in paths {
        let path = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(std::ffi::OsStr::from_bytes(&rel))
        };
        let m = std::fs::symlink_metadata(&path).unwrap();
        let ft = m.file_type();
        let kind = if ft.is_file() {
            "file"
        } else if ft.is_dir() {
            "dir"
        } else if ft.is_symlink() {
            "symlink"
        } else if ft.is_fifo() {
            "fifo"
        } else if ft.is_char_device() {
            "char"
        } else if ft.is_block_device() {
            "block"
        } else {
            continue; // a socket
        };
        let sparse = ft.is_file() && m.blocks() * 512 < m.len();
        let content = if sparse {
            // Where its data is and what it holds: the rest reads as zeros (reading 8 GiB of
            // hole twice would be most of the test's time).
            let mut h = blake3::Hasher::new();
            for (offset, len) in fidelity_extents(&path) {
                h.update(&offset.to_le_bytes()).update(&len.to_le_bytes());
                let mut data = vec![0u8; len as usize];
                std::os::unix::fs::FileExt::read_exact_at(
                    &std::fs::File::open(&path).unwrap(),
                    &mut data,
                    offset,
                )
                .unwrap();
                h.update(&data);
            }
            h.finalize().as_bytes().to_vec()
        } else if ft.is_file() {
            let mut h = blake3::Hasher::new();
            h.update_reader(std::fs::File::open(&path).unwrap()).unwrap();
            h.finalize().as_bytes().to_vec()
        } else if ft.is_symlink() {
            std::fs::read_link(&path).unwrap().as_os_str().as_bytes().to_vec()
        } else {
            Vec::new()
        };
        let link_group = (ft.is_file() && m.nlink() > 1)
            .then(|| groups.entry(m.ino()).or_insert_with(|| rel.clone()).clone());
        let entry = ManifestEntry {
            kind,
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            size: if ft.is_file() || ft.is_symlink() { m.len() } else { 0 },
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            rdev: if ft.is_char_device() || ft.is_block_device() { m.rdev() } else { 0 },
            xattrs: fidelity_xattrs(&path),
            content,
            link_group,
            sparse_blocks: sparse.then(|| m.blocks()),
        };
        out.insert(rel, entry);
    }
    out
}

/// The data extents of the file at `path`, as `SEEK_DATA`/`SEEK_HOLE` find them.
fn fidelity_extents(path: &std::path::Path) -> Vec<(u64, u64)> {
    let f = std::fs::File::open(path).unwrap();
    let (mut pos, mut out) = (0u64, Vec::new());
    while let Ok(start) = rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(pos)) {
        let end = rustix::fs::seek(&f, rustix::fs::SeekFrom::Hole(start)).unwrap();
        out.push((start, end - start));
        pos = end;
    }
    out
}

/// The extended attributes of `path` (not followed), sorted.
fn fidelity_xattrs(path: &std::path::Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    use std::os::unix::ffi::OsStrExt;
    let mut names = vec![0u8; 65536];
    let n = match rustix::fs::llistxattr(path, &mut names[..]) {
        Ok(n) => n,
        Err(rustix::io::Errno::NOTSUP) => 0,
        Err(e) => panic!("{}: {e}", path.display()),
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let mut value = vec![0u8; 65536];
        let len =
            rustix::fs::lgetxattr(path, std::ffi::OsStr::from_bytes(name), &mut value[..]).unwrap();
        value.truncate(len);
        out.push((name.to_vec(), value));
    }
    out.sort();
    out
}

/// An ACL in the kernel's `system.posix_acl_*` xattr form (what `setfacl` writes): version 2,
/// then (tag u16, perm u16, id u32) entries sorted by tag and id.
fn acl_xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

const ACL_UNDEFINED_ID: u32 = u32::MAX;

fn set_xattr(path: &std::path::Path, name: &str, value: &[u8]) -> rustix::io::Result<()> {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty())
}

fn set_mtime(path: &std::path::Path, ns: i64) {
    let times = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT },
        last_modification: rustix::fs::Timespec {
            tv_sec: ns.div_euclid(1_000_000_000),
            tv_nsec: ns.rem_euclid(1_000_000_000) as _,
        },
    };
    rustix::fs::utimensat(rustix::fs::CWD, path, &times, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .unwrap();
}

fn fidelity_is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // The owner of /proc/self is the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Backs up the fidelity tree `src` with `backup` (a `qsm backup` command for it), checks
/// the report (each inode's data read once, the socket skipped and named, nothing failed),
/// restores it with `restore` into `out` and compares the manifests; then checks that an
/// incremental backup of the unchanged tree sends nothing.
fn fidelity_round_trip(
    src: &std::path::Path,
    out: &std::path::Path,
    backup: &mut dyn FnMut() -> assert_cmd::Command,
    restore: &mut dyn FnMut() -> assert_cmd::Command,
) {
    let run = |mut c: assert_cmd::Command| -> serde_json::Value {
        let o = c.arg("--json").output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    // The tree holds what the test is about (or the comparison below proves nothing).
    let m = manifest(src);
    let kinds: std::collections::HashSet<&str> = m.values().map(|e| e.kind).collect();
    for k in ["file", "dir", "symlink", "fifo"] {
        assert!(kinds.contains(k), "no {k} in the tree");
    }
    if fidelity_is_root() && !m.contains_key(&b"b/null"[..]) {
        eprintln!("fidelity: no device nodes in the tree (see the skipped notes)");
    }
    let linked = m.values().filter(|e| e.link_group.as_deref() == Some(b"a/linked")).count();
    assert_eq!(linked, 3, "a link group of three");
    assert!(m[&b"sparse"[..]].sparse_blocks.is_some_and(|b| b * 512 < 1 << 20), "sparse");
    // Where the file system refuses xattrs or ACLs, fidelity_tree said so and left them out.
    let acl_dir = &m[&b"a/acl-dir"[..]];
    if acl_dir.xattrs.iter().any(|(n, _)| n == b"system.posix_acl_default") {
        let f = &m[&b"a/acl-file"[..]];
        assert!(
            f.xattrs.iter().any(|(n, _)| n == b"system.posix_acl_access")
                && f.mode & 0o777 == 0o654,
            "an ACL whose mask shows as the group bits: {f:?}"
        );
    }
    if m[&b"b"[..]].xattrs.is_empty() {
        eprintln!("fidelity: no user xattrs in the tree (see the skipped notes)");
    } else {
        assert!(m[&b"a/xattrs"[..]].xattrs.len() >= 3, "user xattrs");
    }
    let mut first = backup();
    first.arg(src);
    let report = run(first);
    let r = &report[0];
    assert_eq!(r["failed"], 0, "{r}");
    assert_eq!(r["skipped"], 1, "the socket: {r}");
    let warnings = r["warnings"].to_string();
    assert!(warnings.contains("b/socket: a socket, not backed up"), "{warnings}");
    assert_eq!(r["bytes_read"], fidelity_unique_bytes(src), "each inode's data once: {r}");
    let mut c = restore();
    c.arg(src).arg("--to").arg(out);
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!stderr.contains("warning"), "a clean restore warns of nothing: {stderr}");
    assert_same_manifest(src, out);
    let mut again = backup();
    again.arg(src);
    let report = run(again);
    assert_eq!(report[0]["backed_up"], 0, "unchanged: {}", report[0]);
}

/// Builds the fidelity tree at `root` and returns what it could not include, and why (a
/// root-only part when not root, a kernel that refuses a namespace). When not root and
/// `QSM_TEST_REQUIRE_ROOT=1`, fails instead.
fn fidelity_tree(root: &std::path::Path) -> Vec<String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let p = |rel: &str| root.join(rel);
    let root_user = fidelity_is_root();
    let mut skipped = Vec::new();
    if !root_user {
        let why = "not root: no devices, trusted.*/security.* attributes, owners or setuid";
        assert!(
            std::env::var("QSM_TEST_REQUIRE_ROOT").as_deref() != Ok("1"),
            "QSM_TEST_REQUIRE_ROOT=1 but the test does not run as root ({why})"
        );
        skipped.push(why.to_string());
    }
    std::fs::create_dir_all(p("a/acl-dir")).unwrap();
    std::fs::create_dir_all(p("b/deep")).unwrap();
    // Default ACL on a directory (with a named group, so a mask), then a file made in it,
    // which inherits an access ACL from it.
    let default_acl = acl_xattr(&[
        (0x01, 7, ACL_UNDEFINED_ID),
        (0x04, 5, ACL_UNDEFINED_ID),
        (0x08, 7, 4321),
        (0x10, 5, ACL_UNDEFINED_ID),
        (0x20, 0, ACL_UNDEFINED_ID),
    ]);
    let acls = set_xattr(&p("a/acl-dir"), "system.posix_acl_default", &default_acl);
    if let Err(e) = &acls {
        skipped.push(format!("ACLs: the file system refuses them ({e})"));
    }
    std::fs::write(p("a/acl-dir/inherited"), b"inherits the default ACL").unwrap();
    // rw-r--r-- with an ACL granting a user rwx and a mask r-x: the group bits show the mask
    // (r-x), and must come back as exactly that, not wider.
    std::fs::write(p("a/acl-file"), b"acl").unwrap();
    std::fs::set_permissions(p("a/acl-file"), std::fs::Permissions::from_mode(0o644)).unwrap();
    if acls.is_ok() {
        let access = acl_xattr(&[
            (0x01, 6, ACL_UNDEFINED_ID),
            (0x02, 7, 1234),
            (0x04, 4, ACL_UNDEFINED_ID),
            (0x10, 5, ACL_UNDEFINED_ID),
            (0x20, 4, ACL_UNDEFINED_ID),
        ]);
        set_xattr(&p("a/acl-file"), "system.posix_acl_access", &access).unwrap();
    }
    // User xattrs, one empty and one large, on a file and a directory.
    std::fs::write(p("a/xattrs"), b"x").unwrap();
    for (name, value) in
        [("user.comment", &b"hello"[..]), ("user.empty", b""), ("user.big", &[7u8; 3000])]
    {
        if let Err(e) = set_xattr(&p("a/xattrs"), name, value) {
            skipped.push(format!("user xattrs: the file system refuses them ({e})"));
            break;
        }
    }
    let _ = set_xattr(&p("b"), "user.on-a-dir", b"d");
    if root_user {
        if let Err(e) = set_xattr(&p("a/xattrs"), "trusted.qsm", b"t") {
            skipped.push(format!("trusted.* attributes: the kernel refuses them here ({e})"));
        }
        if let Err(e) = set_xattr(&p("a/xattrs"), "security.qsm", b"s") {
            skipped.push(format!("security.qsm: the kernel refuses it here ({e})"));
        }
        // What `setcap cap_net_raw+ep` writes: revision 2, effective, permitted bit 13.
        std::fs::write(p("a/ping"), b"#!/bin/true\n").unwrap();
        std::fs::set_permissions(p("a/ping"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut cap = 0x0200_0001u32.to_le_bytes().to_vec();
        cap.extend_from_slice(&(1u32 << 13).to_le_bytes());
        cap.extend_from_slice(&[0; 12]);
        if let Err(e) = set_xattr(&p("a/ping"), "security.capability", &cap) {
            skipped.push(format!("security.capability: the kernel refuses it here ({e})"));
        }
        // Owners, and setuid/setgid (kept as root only).
        std::fs::write(p("b/owned"), b"owned").unwrap();
        rustix::fs::chown(
            p("b/owned"),
            Some(rustix::fs::Uid::from_raw(1234)),
            Some(rustix::fs::Gid::from_raw(5678)),
        )
        .unwrap();
        std::fs::set_permissions(p("b/owned"), std::fs::Permissions::from_mode(0o6755)).unwrap();
        for (name, kind, dev) in [
            ("b/null", rustix::fs::FileType::CharacterDevice, rustix::fs::makedev(1, 3)),
            ("b/loop", rustix::fs::FileType::BlockDevice, rustix::fs::makedev(7, 200)),
        ] {
            let mode = rustix::fs::Mode::from_raw_mode(0o640);
            if let Err(e) = rustix::fs::mknodat(rustix::fs::CWD, p(name), kind, mode, dev) {
                skipped.push(format!("{name}: cannot make device nodes here ({e})"));
            }
        }
    }
    // A FIFO, and a socket (not backed up: a note, not a failure).
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p("b/fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o620),
        0,
    )
    .unwrap();
    std::mem::forget(std::os::unix::net::UnixListener::bind(p("b/socket")).unwrap());
    // Hard links across directories: stored once, restored as one inode.
    let linked: Vec<u8> =
        (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    std::fs::write(p("a/linked"), &linked).unwrap();
    std::fs::hard_link(p("a/linked"), p("b/deep/linked-2")).unwrap();
    std::fs::hard_link(p("a/linked"), p("b/linked-3")).unwrap();
    // Sparse: 8 GiB holding 64 KiB in the middle and 10 bytes at the very end, and 1 GiB of
    // hole only. Neither is read whole nor comes back allocated.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(p("sparse")).unwrap();
        f.set_len(8 << 30).unwrap();
        f.write_all_at(&[0x5a; 65536], 3 << 30).unwrap();
        f.write_all_at(b"0123456789", (8 << 30) - 10).unwrap();
        std::fs::File::create(p("b/all-hole")).unwrap().set_len(1 << 30).unwrap();
    }
    // Non-UTF-8 names, a symlink with its own time, and a plain file.
    let odd = root.join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir(&odd).unwrap();
    std::fs::write(odd.join(std::ffi::OsStr::from_bytes(b"\xff\xfe.txt")), b"latin-1").unwrap();
    std::fs::write(p("plain"), b"plain\n".repeat(100)).unwrap();
    std::os::unix::fs::symlink("plain", p("link")).unwrap();
    set_mtime(&p("link"), 1_000_000_123_456_789);
    set_mtime(&p("plain"), 1_500_000_000_987_654_321);
    set_mtime(&p("b/fifo"), 1_400_000_000_000_000_001);
    // Directory times last: making their contents changed them.
    for d in ["a/acl-dir", "a", "b/deep", "b", ""] {
        set_mtime(&p(d), 1_600_000_000_000_000_007);
    }
    for s in &skipped {
        eprintln!("fidelity: skipped: {s}");
    }
    skipped
}

/// The bytes a backup must read of the fidelity tree: each inode's data once, and of a sparse
/// file only its data extents (as `SEEK_DATA`/`SEEK_HOLE` find them).
fn fidelity_unique_bytes(root: &std::path::Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let data = |rel: &[u8], e: &ManifestEntry| -> u64 {
        match e.sparse_blocks {
            None => e.size,
            Some(_) => fidelity_extents(&root.join(std::ffi::OsStr::from_bytes(rel)))
                .iter()
                .map(|e| e.1)
                .sum(),
        }
    };
    let mut seen = std::collections::HashSet::new();
    manifest(root)
        .iter()
        .filter(|(_, e)| e.kind == "file")
        .filter(|(rel, e)| seen.insert(e.link_group.clone().unwrap_or_else(|| rel.to_vec())))
        .map(|(rel, e)| data(rel, e))
        .sum()
}

/// Compares the manifests of `src` and its restore `out`, entry by entry, and says which
/// differ and how.
fn assert_same_manifest(src: &std::path::Path, out: &std::path::Path) {
    let (a, b) = (manifest(src), manifest(out));
    let mut problems = Vec::new();
    for (rel, ea) in &a {
        match b.get(rel) {
            None => problems.push(format!("{}: missing", rel.escape_ascii())),
            Some(eb) if ea != eb => {
                problems.push(format!("{}:\n  before {ea:?}\n  after  {eb:?}", rel.escape_ascii()))
            }
            Some(_) => {}
        }
    }
    for rel in b.keys().filter(|r| !a.contains_key(*r)) {
        problems.push(format!("{}: not in the source", rel.escape_ascii()));
    }
    assert!(problems.is_empty(), "restored tree differs:\n{}", problems.join("\n"));
}
