//! End-to-end tests of `qsm backup`, `qsm restore` and `qsm query` with the embedded server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use assert_cmd::Command;
use predicates::prelude::*;
use tempfile::TempDir;

fn qsm(home: &Path) -> Command {
    let mut c = Command::cargo_bin("qsm").unwrap();
    c.env("QSM_HOME", home);
    c
}

fn tree(root: &Path) {
    fs::create_dir_all(root.join("docs/deep")).unwrap();
    fs::write(root.join("docs/a.txt"), b"alpha\n".repeat(1000)).unwrap();
    fs::write(
        root.join("docs/deep/b.bin"),
        (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    fs::set_permissions(root.join("docs/a.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    symlink("docs/a.txt", root.join("link")).unwrap();
}

fn same_tree(a: &Path, b: &Path) {
    for rel in ["docs/a.txt", "docs/deep/b.bin", "empty"] {
        assert_eq!(fs::read(a.join(rel)).unwrap(), fs::read(b.join(rel)).unwrap(), "{rel}");
        let (ma, mb) = (fs::metadata(a.join(rel)).unwrap(), fs::metadata(b.join(rel)).unwrap());
        assert_eq!(ma.mode(), mb.mode(), "{rel} mode");
        assert_eq!(ma.mtime(), mb.mtime(), "{rel} mtime");
    }
    assert_eq!(fs::read_link(b.join("link")).unwrap(), Path::new("docs/a.txt"));
}

#[test]
fn backup_then_restore_is_identical_with_metadata() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    tree(&src);
    qsm(home.path())
        .arg("backup")
        .arg(&src)
        .assert()
        .success()
        .stdout(predicate::str::contains("backed up 7"));
    let out = dir.path().join("out");
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("restored 7"));
    same_tree(&src, &out);
    // A second restore skips what exists: 4 files and links, and 2 directories.
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("skipped 6"));
}

#[test]
fn incremental_backup_sends_only_changes_and_deactivates_deletions() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    tree(&src);
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    qsm(home.path())
        .arg("backup")
        .arg(&src)
        .assert()
        .success()
        .stdout(predicate::str::contains("backed up 0, unchanged 7"));
    fs::write(src.join("docs/a.txt"), b"changed").unwrap();
    fs::remove_file(src.join("empty")).unwrap();
    fs::rename(src.join("docs/deep/b.bin"), src.join("docs/deep/renamed.bin")).unwrap();
    // Sent: a.txt, renamed.bin (a new path), and the two directories whose entries changed
    // (the root and docs/deep; docs itself is unchanged).
    qsm(home.path()).arg("backup").arg(&src).assert().success().stdout(
        predicate::str::contains("backed up 4, unchanged 2")
            .and(predicate::str::contains("marked inactive 2")),
    );
    let listing = qsm(home.path())
        .args(["query", "backup", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let rows: serde_json::Value = serde_json::from_slice(&listing).unwrap();
    let paths: Vec<&str> =
        rows.as_array().unwrap().iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["", "docs", "docs/a.txt", "docs/deep", "docs/deep/renamed.bin", "link"]);
    let out = dir.path().join("out");
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&out).assert().success();
    assert_eq!(fs::read(out.join("docs/a.txt")).unwrap(), b"changed");
    assert!(!out.join("empty").exists() && !out.join("docs/deep/b.bin").exists());
    assert_eq!(
        fs::read(out.join("docs/deep/renamed.bin")).unwrap(),
        fs::read(src.join("docs/deep/renamed.bin")).unwrap()
    );
}

#[test]
fn restore_of_a_subdirectory_and_a_missing_path() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    tree(&src);
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    let out = dir.path().join("out");
    qsm(home.path())
        .arg("restore")
        .arg(src.join("docs/deep"))
        .arg("--to")
        .arg(&out)
        .assert()
        .success();
    assert!(out.join("docs/deep/b.bin").exists());
    assert!(!out.join("docs/a.txt").exists() && !out.join("empty").exists());
    qsm(home.path())
        .args(["restore", "/nowhere/at/all"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("contains /nowhere/at/all"));
    qsm(home.path())
        .args(["backup", "/no/such/dir"])
        .assert()
        .failure()
        .code(1)
        .stderr(predicate::str::contains("/no/such/dir"));
}

/// A restore never writes outside its target: not for a malicious catalog entry, not through
/// a symlink planted in the target.
#[test]
fn restore_never_writes_outside_the_target() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    tree(&src);
    qsm(home.path()).arg("backup").arg(&src).assert().success();

    // A catalog entry named "../escaped", as a damaged or hostile catalog could hold.
    {
        use qsm_catalog::{Attributes, Catalog, NewObject, ObjectKind, ObjectType, SqliteCatalog};
        let cat = SqliteCatalog::open(&home.path().join("catalog.db")).unwrap();
        let node = cat.node("local").unwrap().unwrap().id;
        let fs_id = cat.filespaces(node).unwrap()[0].id;
        let mut t = cat.begin().unwrap();
        for evil in [&b"../escaped"[..], b"docs/../../escaped2", b"/etc/escaped3"] {
            let object = NewObject {
                filespace: fs_id,
                path: evil.to_vec(),
                kind: ObjectKind::Backup,
                object_type: ObjectType::Symlink,
                attrs: Attributes {
                    link_target: Some(b"/etc/passwd".to_vec()),
                    mode: 0o777,
                    ..Attributes::default()
                },
                mgmt_class: None,
                description: None,
                retain_until: None,
                chunks: vec![],
            };
            t.insert_object(&object, 1).unwrap();
        }
        t.commit().unwrap();
    }
    let target = dir.path().join("target");
    let outside = dir.path().join("outside");
    fs::create_dir_all(&target).unwrap();
    fs::create_dir_all(&outside).unwrap();
    // And a symlink planted where a restored directory goes.
    symlink(&outside, target.join("docs")).unwrap();
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&target).assert().code(4).stderr(
        predicate::str::contains("unsafe name")
            .and(predicate::str::contains("refusing to restore through it")),
    );
    assert!(
        fs::read_dir(&outside).unwrap().next().is_none(),
        "something was written through the planted symlink"
    );
    for escaped in ["escaped", "escaped2"] {
        assert!(
            fs::symlink_metadata(dir.path().join(escaped)).is_err(),
            "{escaped} was written outside the target"
        );
    }
    assert!(fs::symlink_metadata("/etc/escaped3").is_err());
    // What is safe was restored.
    assert_eq!(fs::read(target.join("empty")).unwrap(), b"");
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

#[test]
fn point_in_time_and_inactive_versions_restore() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"version one").unwrap();
    fs::write(src.join("gone"), b"deleted later").unwrap();
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    // Versions are timed to the second: let one pass between the two backups.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let between = now();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    fs::write(src.join("f"), b"version two!").unwrap();
    fs::remove_file(src.join("gone")).unwrap();
    qsm(home.path()).arg("backup").arg(&src).assert().success();

    let old = dir.path().join("old");
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&old)
        .arg("--pit")
        .arg(format!("@{between}"))
        .assert()
        .success();
    assert_eq!(fs::read(old.join("f")).unwrap(), b"version one");
    assert_eq!(fs::read(old.join("gone")).unwrap(), b"deleted later");
    let new = dir.path().join("new");
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&new).assert().success();
    assert_eq!(fs::read(new.join("f")).unwrap(), b"version two!");
    assert!(!new.join("gone").exists());

    // An inactive version, chosen by id from the listing.
    let listing = qsm(home.path())
        .args(["query", "backup", "--inactive", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let rows: serde_json::Value = serde_json::from_slice(&listing).unwrap();
    let old_f = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["path"] == "f" && r["state"] == "inactive")
        .expect("inactive version of f");
    let one = dir.path().join("one");
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&one)
        .arg("--id")
        .arg(old_f["id"].to_string())
        .assert()
        .success();
    assert_eq!(fs::read(one.join("f")).unwrap(), b"version one");
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .args(["--id", "999999"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("version 999999"));
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .args(["--pit", "yesterday-ish"])
        .assert()
        .failure()
        .code(2);
}

#[test]
fn archive_and_retrieve_by_description() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("project");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("report.txt"), b"draft").unwrap();
    qsm(home.path())
        .arg("archive")
        .arg(&src)
        .args(["-d", "before review"])
        .assert()
        .success()
        .stdout(predicate::str::contains("kept 365 days"));
    fs::write(src.join("report.txt"), b"final").unwrap();
    qsm(home.path())
        .arg("archive")
        .arg(&src)
        .args(["-d", "after review", "--retain-days", "3650"])
        .assert()
        .success();
    let listing = qsm(home.path())
        .args(["query", "archive", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let rows: serde_json::Value = serde_json::from_slice(&listing).unwrap();
    assert_eq!(rows.as_array().unwrap().iter().filter(|r| r["path"] == "report.txt").count(), 2);
    // Archives are not backups: nothing is active.
    let active = qsm(home.path())
        .args(["query", "backup", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&active).unwrap(),
        serde_json::json!([])
    );

    let out = dir.path().join("r1");
    qsm(home.path())
        .arg("retrieve")
        .arg(&src)
        .args(["-d", "before review", "--to"])
        .arg(&out)
        .assert()
        .success();
    assert_eq!(fs::read(out.join("report.txt")).unwrap(), b"draft");
    let out = dir.path().join("r2");
    qsm(home.path())
        .arg("retrieve")
        .arg(src.join("report.txt"))
        .arg("--to")
        .arg(&out)
        .assert()
        .success();
    assert_eq!(
        fs::read(out.join("report.txt")).unwrap(),
        b"final",
        "the newest archive by default"
    );
}

/// Damage in the pool fails the affected file alone: no partial file, a warning naming it,
/// exit code 4, and every other file restored.
#[test]
fn a_damaged_chunk_fails_only_its_file() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    tree(&src);
    qsm(home.path()).arg("backup").arg(&src).args(["--compression", "off"]).assert().success();
    // Find the container and damage a byte in the middle of b.bin's data (uncompressed, so
    // its 3 MB dominate the container).
    let mut containers = Vec::new();
    let mut stack = vec![home.path().join("pool/containers")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path())
            } else {
                containers.push(e.path())
            }
        }
    }
    let biggest = containers.iter().max_by_key(|p| fs::metadata(p).unwrap().len()).unwrap();
    let mut bytes = fs::read(biggest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(biggest, bytes).unwrap();
    let out = dir.path().join("out");
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&out).assert().code(4).stderr(
        predicate::str::contains("docs/deep/b.bin: not restored")
            .and(predicate::str::contains("checksum")),
    );
    assert!(!out.join("docs/deep/b.bin").exists(), "a damaged file was restored");
    let leftovers: Vec<_> =
        fs::read_dir(out.join("docs/deep")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
    assert_eq!(
        fs::read(out.join("docs/a.txt")).unwrap(),
        fs::read(src.join("docs/a.txt")).unwrap()
    );
}

#[test]
fn a_root_given_through_a_symlink_is_walked_where_it_points() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("real");
    tree(&src);
    let link = dir.path().join("via-link");
    symlink(&src, &link).unwrap();
    qsm(home.path())
        .arg("backup")
        .arg(&link)
        .assert()
        .success()
        .stdout(predicate::str::contains("backed up 7"));
    let out = dir.path().join("out");
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&out).assert().success();
    same_tree(&src, &out);
}

#[test]
fn a_missing_pool_is_refused_not_replaced() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    tree(&src);
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    fs::remove_dir_all(home.path().join("pool")).unwrap();
    qsm(home.path())
        .arg("backup")
        .arg(&src)
        .assert()
        .failure()
        .stderr(predicate::str::contains("refers to a storage pool"));
    assert!(!home.path().join("pool").exists(), "a new empty pool was created");
}

/// As root, owners are restored, and setuid bits survive (the chown comes before the chmod).
#[test]
fn owners_and_setuid_bits_are_restored_as_root() {
    if fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) != 0 {
        eprintln!("SKIPPED: not root; ownership is restored only by root");
        return;
    }
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("owned")).unwrap();
    fs::write(src.join("owned/tool"), b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::chown(src.join("owned"), Some(1234), Some(2345)).unwrap();
    std::os::unix::fs::chown(src.join("owned/tool"), Some(1234), Some(2345)).unwrap();
    fs::set_permissions(src.join("owned/tool"), fs::Permissions::from_mode(0o4755)).unwrap();
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    let out = dir.path().join("out");
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&out).assert().success();
    let tool = fs::metadata(out.join("owned/tool")).unwrap();
    assert_eq!(tool.mode() & 0o7777, 0o4755, "setuid bit lost");
    assert_eq!((tool.uid(), tool.gid()), (1234, 2345));
    let owned = fs::metadata(out.join("owned")).unwrap();
    assert_eq!((owned.uid(), owned.gid()), (1234, 2345), "directory owner not restored");
}

fn active_paths(home: &Path) -> Vec<String> {
    let listing = qsm(home)
        .args(["query", "backup", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let rows: serde_json::Value = serde_json::from_slice(&listing).unwrap();
    rows.as_array().unwrap().iter().map(|r| r["path"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn include_and_exclude_patterns_choose_what_is_backed_up() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    tree(&src);
    fs::create_dir_all(src.join("cache/sub")).unwrap();
    fs::write(src.join("cache/sub/x"), b"x").unwrap();
    fs::write(src.join("docs/deep/c.o"), b"object").unwrap();
    // A name at any depth, a directory only, and a pattern from the configuration file.
    let config = dir.path().join("client.toml");
    fs::write(&config, "exclude = [\"*.o\"]\n").unwrap();
    qsm(home.path())
        .env("QSM_CONFIG", &config)
        .args(["backup", "--exclude", "cache/"])
        .arg(&src)
        .assert()
        .success();
    let paths = active_paths(home.path());
    assert!(paths.iter().all(|p| !p.starts_with("cache") && !p.ends_with(".o")), "{paths:?}");
    assert!(paths.contains(&"docs/deep/b.bin".to_owned()), "{paths:?}");
    // Excluding what was backed up marks it inactive, as a deletion would.
    qsm(home.path())
        .args(["backup", "--exclude", "/**/deep"])
        .arg(&src)
        .assert()
        .success()
        .stdout(predicate::str::contains("marked inactive 2"));
    // Includes take only what matches, plus the directories on the way.
    qsm(home.path()).args(["backup", "--include", "*.txt"]).arg(&src).assert().success();
    let mut paths = active_paths(home.path());
    paths.sort();
    assert_eq!(paths, ["", "cache", "cache/sub", "docs", "docs/a.txt", "docs/deep"]);
    qsm(home.path())
        .args(["backup", "--exclude", "a[b"])
        .arg(&src)
        .assert()
        .failure()
        .stderr(predicate::str::contains("exclude pattern \"a[b\""));
}

#[test]
fn existing_files_are_skipped_replaced_or_kept_beside_the_restored_copy() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    tree(&src);
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    let original = fs::read(src.join("docs/a.txt")).unwrap();
    fs::write(src.join("docs/a.txt"), b"edited since").unwrap();
    let restore = |extra: &[&str]| {
        qsm(home.path()).arg("restore").arg(src.join("docs")).args(extra).assert().success()
    };
    restore(&[]).stdout(predicate::str::contains("skipped 4"));
    assert_eq!(fs::read(src.join("docs/a.txt")).unwrap(), b"edited since");
    restore(&["--rename"]).stdout(predicate::str::contains("(2 beside existing files)"));
    assert_eq!(fs::read(src.join("docs/a.txt")).unwrap(), b"edited since", "kept");
    assert_eq!(fs::read(src.join("docs/a.txt.restored")).unwrap(), original);
    restore(&["--rename"]);
    assert_eq!(fs::read(src.join("docs/a.txt.restored.2")).unwrap(), original);
    assert_eq!(fs::read(src.join("docs/deep/b.bin.restored")).unwrap().len(), 3_000_000);
    restore(&["--replace"]);
    assert_eq!(fs::read(src.join("docs/a.txt")).unwrap(), original);
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .args(["--replace", "--rename"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cannot be used with"));
}

#[test]
fn a_single_file_backs_up_and_restores_like_cp() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let file = dir.path().join("notes.txt");
    fs::write(&file, b"one file, its own filespace\n".repeat(100)).unwrap();
    let content = fs::read(&file).unwrap();
    qsm(home.path()).arg("backup").arg(&file).assert().success();
    fs::remove_file(&file).unwrap();
    qsm(home.path())
        .arg("restore")
        .arg(&file)
        .assert()
        .success()
        .stdout(predicate::str::contains("restored 1"));
    assert_eq!(fs::read(&file).unwrap(), content);
    // Into a directory: under its own name; to a new name: as that name.
    let into = dir.path().join("into");
    fs::create_dir(&into).unwrap();
    qsm(home.path()).arg("restore").arg(&file).arg("--to").arg(&into).assert().success();
    assert_eq!(fs::read(into.join("notes.txt")).unwrap(), content);
    let renamed = dir.path().join("copy.txt");
    qsm(home.path()).arg("restore").arg(&file).arg("--to").arg(&renamed).assert().success();
    assert_eq!(fs::read(&renamed).unwrap(), content);
}

/// Runs `qsm` without the capabilities that let root read any file, so permissions bite in CI,
/// which runs as root.
fn qsm_unprivileged(home: &Path) -> Command {
    if rustix_euid_is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--bounding-set=-all", "--"])
            .arg(assert_cmd::cargo::cargo_bin("qsm"))
            .env("QSM_HOME", home);
        c
    } else {
        qsm(home)
    }
}

fn rustix_euid_is_root() -> bool {
    fs::metadata("/proc/self").unwrap().uid() == 0
}

#[test]
fn unreadable_files_and_directories_are_warned_counted_and_kept() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    tree(&src);
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    fs::write(src.join("docs/a.txt"), b"changed, then made unreadable").unwrap();
    fs::set_permissions(src.join("docs/a.txt"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::set_permissions(src.join("docs/deep"), fs::Permissions::from_mode(0o000)).unwrap();
    let out = qsm_unprivileged(home.path()).arg("backup").arg(&src).assert().code(4);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    fs::set_permissions(src.join("docs/deep"), fs::Permissions::from_mode(0o755)).unwrap();
    assert!(stderr.contains("docs/a.txt: not backed up: Permission denied"), "{stderr}");
    assert!(stderr.contains("docs/deep: not examined: Permission denied"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(stdout.contains("failed 2") && stdout.contains("marked inactive 0"), "{stdout}");
    // Nothing unreadable was taken for deleted: the earlier versions are still active.
    let paths = active_paths(home.path());
    assert!(paths.contains(&"docs/deep/b.bin".to_owned()), "{paths:?}");
    assert!(paths.contains(&"docs/a.txt".to_owned()), "{paths:?}");
}

/// With deduplication too: the abandoned file's chunks were sent but never committed, so the
/// dedup cache must not learn them, or the next backup would reference chunks the server does
/// not hold (a regression found in review).
#[test]
fn a_file_that_changes_while_it_is_read_is_reported_and_the_next_backup_takes_it() {
    for dedup in ["off", "on"] {
        changes_while_read(dedup);
    }
}

fn changes_while_read(dedup: &str) {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    let log = src.join("growing.log");
    fs::write(&log, vec![b'x'; 64 << 20]).unwrap();
    let stop = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            let mut f = fs::OpenOptions::new().append(true).open(&log).unwrap();
            while !stop.load(Ordering::Relaxed) {
                f.write_all(b"appended line\n").unwrap();
            }
        });
        let out = qsm(home.path())
            .args(["backup", "--compression", "off", "--dedup", dedup])
            .arg(&src)
            .output();
        stop.store(true, Ordering::Relaxed);
        out.unwrap()
    });
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("growing.log: not backed up: it changed while being read"), "{stderr}");
    // Once it is quiet, the next incremental takes it, byte for byte.
    qsm(home.path()).args(["backup", "--dedup", dedup]).arg(&src).assert().success();
    let back = dir.path().join("back");
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&back).assert().success();
    assert_eq!(fs::read(back.join("growing.log")).unwrap(), fs::read(&log).unwrap());
}

#[test]
fn files_vanishing_during_the_walk_never_fail_the_backup_or_the_next_one() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    for d in 0..20 {
        fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
        for f in 0..100 {
            fs::write(src.join(format!("d{d}/f{f}")), format!("{d}/{f}")).unwrap();
        }
    }
    let stop = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            // Churn: files and whole directories come and go while the backup walks.
            let mut round = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let d = src.join(format!("d{}", round % 20));
                let _ = fs::remove_dir_all(&d);
                let _ = fs::create_dir_all(&d);
                for f in 0..100 {
                    let _ = fs::write(d.join(format!("f{f}")), format!("round {round}"));
                }
                round += 1;
            }
        });
        let out = qsm(home.path()).arg("backup").arg(&src).output();
        stop.store(true, Ordering::Relaxed);
        out.unwrap()
    });
    // Files that vanished between the walk and their reading are warnings, not failures of
    // the backup; one that vanished before being listed is simply not there.
    assert!(matches!(out.status.code(), Some(0 | 4)), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    let back = dir.path().join("back");
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&back).assert().success();
    for d in 0..20 {
        for f in 0..100 {
            let rel = format!("d{d}/f{f}");
            assert_eq!(fs::read(back.join(&rel)).unwrap(), fs::read(src.join(&rel)).unwrap());
        }
    }
}

#[test]
fn names_around_the_separator_merge_with_the_inventory() {
    // '-' and '.' sort before '/', so the catalog holds a, a-b, a.txt, a/b: the walk must come
    // in that order too, or unchanged files would be sent again and present ones deactivated.
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    for d in ["a/b", "a-b", "a.d/x"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    for f in ["a.txt", "a/b/c", "a-b/f", "a.d/x/y", "a0"] {
        fs::write(src.join(f), f).unwrap();
    }
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    qsm(home.path())
        .arg("backup")
        .arg(&src)
        .assert()
        .success()
        .stdout(predicate::str::contains("backed up 0, unchanged 11"));
    fs::remove_file(src.join("a.txt")).unwrap();
    fs::remove_file(src.join("a/b/c")).unwrap();
    // Sent: the root and a/b (their entries changed); gone: a.txt and a/b/c.
    qsm(home.path()).arg("backup").arg(&src).assert().success().stdout(
        predicate::str::contains("examined 9, backed up 2, unchanged 7")
            .and(predicate::str::contains("marked inactive 2")),
    );
}

/// Text-like data: words of a small vocabulary in a pseudo-random order (compresses about
/// 3-4:1 with zstd, more at higher levels).
fn words(bytes: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "quantum ", "backup ", "restore ", "server ", "catalog ", "pool ", "frame ", "codec ",
        "stream ", "archive ", "policy ", "version ", "node ", "chunk ", "index\n", "tape ",
    ];
    let mut out = Vec::with_capacity(bytes + 16);
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    while out.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(WORDS[(x % 16) as usize].as_bytes());
        if x.is_multiple_of(7) {
            out.extend_from_slice(format!("{} ", x % 100_000).as_bytes());
        }
    }
    out.truncate(bytes);
    out
}

fn backup_json(home: &Path, args: &[&str], src: &Path) -> serde_json::Value {
    let out = qsm(home).arg("backup").arg("--json").args(args).arg(src).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()[0].clone()
}

#[test]
fn auto_compresses_harder_on_a_slow_link_and_says_why() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    // 12 MiB: the first quantum per worker compresses before the link is measured, at the
    // starting zstd-3; the rest should be chosen for the link.
    fs::write(src.join("words.txt"), words(12 << 20)).unwrap();
    // 5 Mbit/s: even zstd:19 on two cores compresses faster than the link sends (at 10 Mbit/s
    // the two are about even there, and either may be called the bottleneck).
    let report = backup_json(home.path(), &["--limit-upload", "5Mbit"], &src);
    assert_eq!(report["bottleneck"], "network", "{report}");
    let text = report["compression"].as_str().unwrap();
    assert!(text.starts_with("network-bound at "), "{text}");
    // Above the static auto's zstd-3: the link is the limit and the cores are idle.
    let heavy: u64 = report["compression_mix"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            let s = r["setting"].as_str().unwrap();
            s.strip_prefix("zstd:").and_then(|l| l.parse::<i32>().ok()).is_some_and(|l| l > 3)
        })
        .map(|r| r["quanta"].as_u64().unwrap())
        .sum();
    assert!(heavy >= 2, "no quantum above zstd:3 on 5 Mbit/s: {report}");
    // Quanta of several settings in one file restore as one.
    let out = dir.path().join("out");
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&out).assert().success();
    assert_eq!(fs::read(out.join("words.txt")).unwrap(), fs::read(src.join("words.txt")).unwrap());
    // A fixed setting is reported as the only one used.
    let fixed = backup_json(home.path(), &["--selective", "--compression", "lz4"], &src);
    let mix = fixed["compression_mix"].as_array().unwrap();
    assert_eq!(mix.len(), 1, "{fixed}");
    assert_eq!(mix[0]["setting"], "lz4");
    assert_eq!(fixed["bottleneck"], serde_json::Value::Null);
}
