//! End-to-end tests of deduplication and client-side encryption (issue 6) through the real
//! binary and the embedded store: what is sent, what the store holds, wrong passphrases, key
//! recovery, and frames flipped, truncated, swapped and replayed behind the client's back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;
use qsm_catalog::{Catalog, SqliteCatalog};
use tempfile::TempDir;

/// A machine: an embedded store, a home for the key file, and a passphrase file.
struct Machine {
    dir: TempDir,
}

impl Machine {
    fn new() -> Machine {
        let m = Machine { dir: TempDir::new().unwrap() };
        m.passphrase("pass", "correct horse battery staple");
        m
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn passphrase(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        fs::write(&p, format!("{text}\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        p
    }

    fn qsm(&self) -> Command {
        let mut c = Command::cargo_bin("qsm").unwrap();
        c.env("QSM_HOME", self.path("store"))
            .env("HOME", self.path("home"))
            .env("QSM_PASSPHRASE_FILE", self.path("pass"))
            .env_remove("QSM_KEY_FILE")
            .env_remove("QSM_SERVER");
        c
    }

    fn json(&self, args: &[&str], path: &Path) -> serde_json::Value {
        let out = self.qsm().args(args).arg(path).arg("--json").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0].clone()
    }

    fn catalog(&self) -> SqliteCatalog {
        SqliteCatalog::open(&self.path("store/catalog.db")).unwrap()
    }
}

include!("suite/noise.rs");

fn diff(a: &Path, b: &Path) {
    let out = std::process::Command::new("diff").arg("-r").arg(a).arg(b).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn dedup_sends_nothing_for_an_unchanged_tree_and_little_for_a_change() {
    let m = Machine::new();
    let src = m.path("src");
    fs::create_dir_all(src.join("copies")).unwrap();
    for i in 0..6u64 {
        fs::write(src.join(format!("f{i}.bin")), noise(700_000, i + 1)).unwrap();
    }
    // Two copies of a file: its chunks are sent once, even within the first backup.
    fs::copy(src.join("f0.bin"), src.join("copies/f0.bin")).unwrap();
    fs::write(src.join("small.txt"), b"below the minimum chunk: one chunk").unwrap();

    let first = m.json(&["backup", "--dedup", "on"], &src);
    let size = 7 * 700_000;
    assert!(first["dedup_bytes"].as_u64().unwrap() >= 600_000, "the copy: {first}");
    assert!(first["bytes_stored"].as_u64().unwrap() < size, "{first}");

    // "100,2": a full backup of the unchanged tree sends nothing, and asks nothing either:
    // the local cache knows every chunk.
    let again = m.json(&["backup", "--full", "--dedup", "on"], &src);
    assert_eq!(again["backed_up"], 10, "{again}");
    assert_eq!(again["bytes_stored"], 0, "{again}");
    assert_eq!(again["dedup_chunks"], again["chunks"], "{again}");
    assert_eq!(again["asked"], 0, "{again}");

    // An insertion near the start of one file: content-defined chunks move with it, so only
    // the chunks around it are sent.
    let mut edited = fs::read(src.join("f3.bin")).unwrap();
    edited.splice(1000..1000, b"a few new bytes".iter().copied());
    fs::write(src.join("f3.bin"), &edited).unwrap();
    let changed = m.json(&["backup", "--dedup", "on"], &src);
    assert_eq!(changed["backed_up"], 1, "{changed}");
    let stored = changed["bytes_stored"].as_u64().unwrap();
    assert!(stored > 0 && stored < 400_000, "{stored} bytes sent of a 700 kB file: {changed}");

    // Without the cache (a new machine), the server is asked and still nothing is sent.
    fs::remove_file(m.path("store/dedup.cache")).unwrap();
    let cold = m.json(&["backup", "--full", "--dedup", "on"], &src);
    assert_eq!(cold["bytes_stored"], 0, "{cold}");
    assert_eq!(cold["cache_hits"], 0, "{cold}");
    assert!(cold["asked"].as_u64().unwrap() > 0, "{cold}");

    // A damaged cache is discarded, said so, and changes nothing stored.
    fs::write(m.path("store/dedup.cache"), b"QSMD garbage").unwrap();
    m.qsm()
        .args(["backup", "--full", "--dedup", "on"])
        .arg(&src)
        .assert()
        .success()
        .stdout(predicate::str::contains("dedup cache not used"));

    let out = m.path("out");
    m.qsm().arg("restore").arg(&src).arg("--to").arg(&out).assert().success();
    diff(&src, &out);
    // The catalog's invariants hold with shared chunks.
    assert!(m.catalog().check().unwrap().problems.is_empty());
}

#[test]
fn encrypted_backups_restore_and_the_store_holds_no_plaintext() {
    let m = Machine::new();
    let src = m.path("src");
    fs::create_dir_all(&src).unwrap();
    let marker = "a secret line the server must never see";
    fs::write(src.join("secret.txt"), marker.repeat(2000)).unwrap();
    fs::write(src.join("noise.bin"), noise(2_500_000, 9)).unwrap();

    // First use: a key is made, wrapped under the passphrase, and the server gets a copy.
    m.qsm()
        .args(["backup", "--encryption", "on"])
        .arg(&src)
        .assert()
        .success()
        .stderr(predicate::str::contains("a new key"))
        .stdout(predicate::str::contains("encrypted"));
    let key = m.path("home/.config/qsm/key");
    assert_eq!(fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    for entry in walk(&m.path("store")) {
        let bytes = fs::read(&entry).unwrap();
        assert!(
            !bytes.windows(marker.len()).any(|w| w == marker.as_bytes()),
            "{} holds plaintext",
            entry.display()
        );
    }
    // Encryption and dedup together, on top of what is stored.
    m.qsm()
        .args(["backup", "--full", "--encryption", "on", "--dedup", "on"])
        .arg(&src)
        .assert()
        .success();

    let out = m.path("out");
    m.qsm().arg("restore").arg(&src).arg("--to").arg(&out).assert().success();
    diff(&src, &out);

    // A wrong passphrase: a clear error before anything is written.
    let bad = m.passphrase("bad", "not the passphrase");
    let never = m.path("never");
    m.qsm()
        .env("QSM_PASSPHRASE_FILE", &bad)
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&never)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("wrong passphrase"));
    assert!(!never.exists(), "nothing may be written with a wrong passphrase");

    // Without the key, encrypted files are refused by name, not written as garbage.
    let nokey = m.path("nokey");
    m.qsm()
        .env_remove("QSM_PASSPHRASE_FILE")
        .env("HOME", m.path("elsewhere"))
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&nokey)
        .assert()
        .code(4)
        .stderr(
            predicate::str::contains("secret.txt: not restored")
                .and(predicate::str::contains("encrypted")),
        );
    assert!(!nokey.join("secret.txt").exists());

    // The recovery procedure: the key file is lost; the passphrase alone gets it back from
    // the server's copy, and `qsm key show-fingerprint` proves it is the same key.
    let fingerprint = |m: &Machine| {
        let out = m.qsm().args(["key", "show-fingerprint"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let before = fingerprint(&m);
    fs::remove_file(&key).unwrap();
    m.qsm()
        .args(["key", "recover"])
        .assert()
        .success()
        .stdout(predicate::str::contains("recovered"));
    assert_eq!(fingerprint(&m), before);
    let again = m.path("again");
    m.qsm().arg("restore").arg(&src).arg("--to").arg(&again).assert().success();
    diff(&src, &again);

    // A new passphrase rewraps the key here and on the server: the old one opens nothing.
    let new = m.passphrase("new", "a brand new passphrase");
    m.qsm()
        .env("QSM_NEW_PASSPHRASE_FILE", &new)
        .args(["key", "change-passphrase"])
        .assert()
        .success();
    fs::remove_file(&key).unwrap();
    m.qsm()
        .args(["key", "recover"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("wrong passphrase"));
    m.qsm().env("QSM_PASSPHRASE_FILE", &new).args(["key", "recover"]).assert().success();
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

/// The chunk rows of the active version of `path`: (chunk id, container, offset, stored_len).
fn chunks_of(cat: &SqliteCatalog, path: &str, active: bool) -> Vec<(i64, u64, u64, u32)> {
    let node = cat.node("local").unwrap().unwrap().id;
    let fs_id = cat.filespaces(node).unwrap()[0].id;
    let versions = cat.versions(fs_id, path.as_bytes()).unwrap();
    let v = versions.iter().find(|v| v.active == active).expect("no such version");
    cat.object_chunks(v.id)
        .unwrap()
        .iter()
        .map(|c| (c.id.0, c.location.container.0, c.location.offset, c.location.stored_len))
        .collect()
}

/// The active version of `path` in the `src` filespace.
fn chunks_of_active(cat: &SqliteCatalog, path: &str) -> qsm_catalog::ObjectId {
    let node = cat.node("local").unwrap().unwrap().id;
    let fs = cat.filespaces(node).unwrap().into_iter().find(|f| f.name.ends_with("/src")).unwrap();
    cat.versions(fs.id, path.as_bytes()).unwrap().into_iter().find(|v| v.active).unwrap().id
}

fn set_location(cat: &SqliteCatalog, chunk: i64, to: (u64, u64, u32)) {
    cat.raw_execute_for_tests(&format!(
        "UPDATE chunks SET container_id = {}, frame_offset = {}, stored_len = {} WHERE id = {chunk}",
        to.0 as i64, to.1, to.2
    ))
    .unwrap();
}

/// Restores into a new directory; the file `name` must fail with `why`, and not be written.
fn restore_fails(m: &Machine, src: &Path, to: &str, name: &str, why: &str) {
    let out = m.path(to);
    m.qsm().arg("restore").arg(src).arg("--to").arg(&out).assert().code(4).stderr(
        predicate::str::contains(format!("{name}: not restored"))
            .and(predicate::str::contains(why)),
    );
    assert!(!out.join(name).exists(), "{name} was written from a tampered frame");
}

#[test]
fn tampered_frames_are_detected_named_and_never_written() {
    let m = Machine::new();
    let src = m.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a.txt"), b"version one of a\n".repeat(5000)).unwrap();
    fs::write(src.join("b.txt"), b"the other file, b\n".repeat(5000)).unwrap();
    m.qsm().args(["backup", "--encryption", "on"]).arg(&src).assert().success();
    fs::write(src.join("a.txt"), b"version two of a\n".repeat(5000)).unwrap();
    m.qsm().args(["backup", "--encryption", "on"]).arg(&src).assert().success();

    let cat = m.catalog();
    let a_new = chunks_of(&cat, "a.txt", true)[0];
    let a_old = chunks_of(&cat, "a.txt", false)[0];
    let b = chunks_of(&cat, "b.txt", true)[0];
    let loc = |c: (i64, u64, u64, u32)| (c.1, c.2, c.3);

    // Replayed: a's active version pointed at the older version's frame.
    set_location(&cat, a_new.0, loc(a_old));
    restore_fails(&m, &src, "replayed", "a.txt", "failed authentication");
    set_location(&cat, a_new.0, loc(a_new));

    // Swapped between two objects.
    set_location(&cat, a_new.0, loc(b));
    set_location(&cat, b.0, loc(a_new));
    restore_fails(&m, &src, "swapped", "b.txt", "failed authentication");
    restore_fails(&m, &src, "swapped2", "a.txt", "failed authentication");
    set_location(&cat, a_new.0, loc(a_new));
    set_location(&cat, b.0, loc(b));

    // Truncated: the catalog's length one byte short of the frame.
    set_location(&cat, b.0, (b.1, b.2, b.3 - 1));
    restore_fails(&m, &src, "truncated", "b.txt", "the data is not returned");
    set_location(&cat, b.0, loc(b));

    // A flipped bit in the pool: found by the checksum over the sealed bytes.
    let container = walk(&m.path("store/pool"))
        .into_iter()
        .find(|p| p.file_name().unwrap().to_string_lossy().contains(&format!("{:016x}", b.1)))
        .expect("b's container");
    let mut bytes = fs::read(&container).unwrap();
    let at = (b.2 + 28 + 40) as usize;
    bytes[at] ^= 0x01;
    fs::write(&container, &bytes).unwrap();
    restore_fails(
        &m,
        &src,
        "flipped",
        "b.txt",
        "damaged data at byte 0 of the file: checksum mismatch",
    );
    bytes[at] ^= 0x01;
    fs::write(&container, &bytes).unwrap();

    // Downgraded: a's encrypted frame replaced by a plaintext frame of the same length and its
    // id removed, as a hostile server could. A plain restore cannot tell it from a file backed
    // up before encryption was on (FORMAT.md 13.1); --require-encryption refuses it.
    let forged_dir = m.path("forged");
    fs::create_dir_all(&forged_dir).unwrap();
    fs::write(forged_dir.join("p.txt"), b"forged plaintext\n".repeat(5000)).unwrap();
    m.qsm().arg("backup").arg(&forged_dir).assert().success();
    let node = cat.node("local").unwrap().unwrap().id;
    let forged_fs =
        cat.filespaces(node).unwrap().into_iter().find(|f| f.name.ends_with("/forged")).unwrap();
    let p = &cat.versions(forged_fs.id, b"p.txt").unwrap()[0];
    let p = cat.object_chunks(p.id).unwrap()[0];
    let a_hash = cat.object_chunks(chunks_of_active(&cat, "a.txt")).unwrap()[0].hash.unwrap();
    set_location(&cat, a_new.0, (p.location.container.0, p.location.offset, p.location.stored_len));
    cat.raw_execute_for_tests(&format!("UPDATE chunks SET hash = NULL WHERE id = {}", a_new.0))
        .unwrap();
    let plain = m.path("downgraded");
    m.qsm().arg("restore").arg(&src).arg("--to").arg(&plain).assert().success();
    assert_eq!(fs::read(plain.join("a.txt")).unwrap(), b"forged plaintext\n".repeat(5000));
    let out = m.path("required");
    m.qsm()
        .args(["restore", "--require-encryption"])
        .arg(&src)
        .arg("--to")
        .arg(&out)
        .assert()
        .code(4)
        .stderr(
            predicate::str::contains("a.txt: not restored")
                .and(predicate::str::contains("not encrypted")),
        );
    assert!(!out.join("a.txt").exists());
    assert_eq!(fs::read(out.join("b.txt")).unwrap(), fs::read(src.join("b.txt")).unwrap());
    set_location(&cat, a_new.0, loc(a_new));
    let hex: String = a_hash.iter().map(|b| format!("{b:02x}")).collect();
    cat.raw_execute_for_tests(&format!("UPDATE chunks SET hash = X'{hex}' WHERE id = {}", a_new.0))
        .unwrap();

    // Mended, everything restores again: the tests above changed nothing stored.
    let out = m.path("mended");
    m.qsm().arg("restore").arg(&src).arg("--to").arg(&out).assert().success();
    diff(&src, &out);
}
