//! End-to-end tests of deduplication and client-side encryption (issue 6), and of one key shared
//! by a node's machines across a change of passphrase (issue 32.3), through the real
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
        private_file(self.path(name), text)
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
        .code(1)
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
/// The restore exits 4 when another file came back, 1 when every file failed.
fn restore_fails(m: &Machine, src: &Path, to: &str, name: &str, why: &str) {
    restore_fails_with(m, src, to, name, why, 4);
}

fn restore_fails_with(m: &Machine, src: &Path, to: &str, name: &str, why: &str, code: i32) {
    let out = m.path(to);
    m.qsm().arg("restore").arg(src).arg("--to").arg(&out).assert().code(code).stderr(
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
    // Both files fail: nothing restored, exit 1.
    restore_fails_with(&m, &src, "swapped", "b.txt", "failed authentication", 1);
    restore_fails_with(&m, &src, "swapped2", "a.txt", "failed authentication", 1);
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

/// Issue 32.3: the machines of one node sharing its key through the server's copy, on the
/// embedded store (every machine opening one `QSM_HOME`) and through a `qsm server`.
mod shared_key {

    use super::*;

    include!("suite/plain_server.rs");

    /// One node, its store, and the machines it runs on, each with its own home (so its own
    /// key file) and passphrase files.
    struct Node {
        dir: TempDir,
        server: Option<ServerProc>,
    }

    const NODE: &str = "shared";

    impl Node {
        fn new(over_network: bool) -> Node {
            let dir = TempDir::new().unwrap();
            let server = over_network.then(|| {
                let server = ServerProc::start(&dir.path().join("srv"));
                Command::cargo_bin("qsm")
                    .unwrap()
                    .arg("admin")
                    .arg("--server")
                    .arg(format!("unix:{}", server.data.join("qsm.sock").display()))
                    .args(["register-node", NODE])
                    .write_stdin("node password\n")
                    .assert()
                    .success();
                server
            });
            let node = Node { dir, server };
            node.file("node.pw", "node password");
            for (name, text) in [("p1", "the first passphrase"), ("p2", "the second passphrase")] {
                node.file(name, text);
            }
            node
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.dir.path().join(rel)
        }

        /// A private file holding `text` and a newline (a passphrase or a password).
        fn file(&self, name: &str, text: &str) -> PathBuf {
            private_file(self.path(name), text)
        }

        /// `qsm` on `machine`, with the passphrase of the file `pass`.
        fn on(&self, machine: &str, pass: &str) -> Command {
            let mut c = Command::cargo_bin("qsm").unwrap();
            c.env("HOME", self.path(machine))
                .env("QSM_PASSPHRASE_FILE", self.path(pass))
                .env_remove("QSM_KEY_FILE")
                .env_remove("QSM_NEW_PASSPHRASE_FILE")
                .env_remove("QSM_OLD_PASSPHRASE_FILE");
            match &self.server {
                Some(s) => c
                    .env("QSM_SERVER", &s.url)
                    .env("QSM_NODE", NODE)
                    .env("QSM_PASSWORD_FILE", self.path("node.pw"))
                    .env("QSM_HOME", "/nonexistent/embedded-must-not-be-used"),
                None => c.env("QSM_HOME", self.path("store")).env_remove("QSM_SERVER"),
            };
            c
        }

        fn key(&self, machine: &str) -> PathBuf {
            self.path(machine).join(".config/qsm/key")
        }

        /// The key file the store holds for the node, read from its catalog.
        fn server_copy(&self) -> Option<Vec<u8>> {
            let (db, node) = match &self.server {
                Some(s) => (s.data.join("catalog.db"), NODE),
                None => (self.path("store/catalog.db"), "local"),
            };
            let cat = SqliteCatalog::open(&db).unwrap();
            cat.node_key(cat.node(node).unwrap().unwrap().id).unwrap()
        }

        fn fingerprint(&self, machine: &str, pass: &str) -> String {
            let out = self.on(machine, pass).args(["key", "show-fingerprint"]).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        }

        fn backup(&self, machine: &str, pass: &str, src: &Path) -> String {
            let out = self
                .on(machine, pass)
                .args(["backup", "--encryption", "on"])
                .arg(src)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(out.status.success(), "backup on {machine}: {stderr}");
            stderr
        }
    }

    fn source(node: &Node) -> PathBuf {
        let src = node.path("src");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("a.txt"), b"sealed under the node's one key\n".repeat(300)).unwrap();
        src
    }

    /// B changes the passphrase; A, its file still under the old one, is told the server
    /// holds the same key rewrapped, backs up on, cannot put the old wrapping back even with
    /// --replace, and takes the new one with `key recover --refresh`.
    fn a_passphrase_changed_on_one_machine_reaches_the_others(node: &Node) {
        let src = source(node);
        // A makes the key on first use; B fetches it with the same passphrase.
        node.backup("a", "p1", &src);
        node.backup("b", "p1", &src);
        let fingerprint = node.fingerprint("a", "p1");
        assert_eq!(node.fingerprint("b", "p1"), fingerprint);
        let first = fs::read(node.key("a")).unwrap();
        assert_eq!(first.len(), 120, "a new key file is version 2");
        assert_eq!(node.server_copy().as_deref(), Some(&first[..]));

        node.on("b", "p1")
            .env("QSM_NEW_PASSPHRASE_FILE", node.path("p2"))
            .args(["key", "change-passphrase"])
            .assert()
            .success()
            .stdout(predicate::str::contains("rewrapped too"));
        let rewrapped = fs::read(node.key("b")).unwrap();
        assert_eq!(node.server_copy().as_deref(), Some(&rewrapped[..]));

        // A backs up with its key and is told, once, what happened and what to run.
        fs::write(src.join("a.txt"), b"changed on A after the passphrase change\n").unwrap();
        let said = node.backup("a", "p1", &src);
        assert_eq!(said.matches("under a newer passphrase").count(), 1, "{said}");
        assert!(
            said.contains(&fingerprint) && said.contains("qsm key recover --refresh"),
            "{said}"
        );
        assert!(!said.contains("not the local key"), "{said}");
        assert_eq!(node.server_copy().as_deref(), Some(&rewrapped[..]), "a backup overwrote it");

        // The old wrapping never goes back, with or without --replace.
        for replace in [false, true] {
            let mut c = node.on("a", "p1");
            c.args(["key", "upload"]);
            if replace {
                c.arg("--replace");
            }
            c.assert().failure().stderr(
                predicate::str::contains("even --replace")
                    .and(predicate::str::contains("qsm key recover --refresh"))
                    .and(predicate::str::contains("qsm key change-passphrase")),
            );
            assert_eq!(node.server_copy().as_deref(), Some(&rewrapped[..]));
        }
        // The server's copy opens with the new passphrase only.
        let elsewhere = node.on("c", "p1").args(["key", "recover"]).output().unwrap();
        assert!(!elsewhere.status.success());
        assert!(String::from_utf8_lossy(&elsewhere.stderr).contains("wrong passphrase"));

        // A plain recover points at --refresh; --refresh with the old passphrase opens nothing
        // and changes nothing; with the new one, A's file becomes the server's.
        node.on("a", "p2")
            .args(["key", "recover"])
            .assert()
            .failure()
            .stderr(predicate::str::contains("exists").and(predicate::str::contains("--refresh")));
        node.on("a", "p1")
            .args(["key", "recover", "--refresh"])
            .assert()
            .failure()
            .stderr(predicate::str::contains("wrong passphrase"));
        assert_eq!(fs::read(node.key("a")).unwrap(), first);
        node.on("a", "p2").args(["key", "recover", "--refresh"]).assert().success().stdout(
            predicate::str::contains("refreshed").and(predicate::str::contains(&fingerprint)),
        );
        assert_eq!(fs::read(node.key("a")).unwrap(), rewrapped);
        assert_eq!(fs::metadata(node.key("a")).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(node.fingerprint("a", "p2"), fingerprint);
        node.on("a", "p1").args(["key", "show-fingerprint"]).assert().failure();
        // Nothing more to say, and what both machines backed up restores with the new one.
        let said = node.backup("a", "p2", &src);
        assert!(!said.contains("passphrase"), "{said}");
        let out = node.path("out");
        node.on("a", "p2").arg("restore").arg(&src).arg("--to").arg(&out).assert().success();
        diff(&src, &out);
    }

    /// `key init` on a machine of a node whose server holds a key: refused, explained, and
    /// done only with --force; the new key is then refused by backups and by `recover
    /// --refresh`, which would otherwise lose it.
    fn key_init_refuses_a_second_key_unless_forced(node: &Node) {
        let src = source(node);
        node.backup("a", "p1", &src);
        let held = node.server_copy().unwrap();
        let fingerprint = node.fingerprint("a", "p1");
        node.on("c", "p2").args(["key", "init"]).assert().failure().stderr(
            predicate::str::contains("already holds a key file")
                .and(predicate::str::contains(&fingerprint))
                .and(predicate::str::contains("qsm key recover"))
                .and(predicate::str::contains("--force")),
        );
        assert!(!node.key("c").exists(), "a refused init wrote a key");
        node.on("c", "p2")
            .args(["key", "init", "--force"])
            .assert()
            .success()
            .stdout(predicate::str::contains("still holds"));
        let other = node.fingerprint("c", "p2");
        assert_ne!(other, fingerprint);
        assert_eq!(node.server_copy().unwrap(), held, "init --force touched the server's copy");
        // A backup with the other key is refused, naming the server's key.
        node.on("c", "p2")
            .args(["backup", "--encryption", "on"])
            .arg(&src)
            .assert()
            .failure()
            .stderr(predicate::str::contains(format!("of another key, {fingerprint}")));
        // --refresh with the passphrase of the server's copy opens it, sees another key, and
        // keeps this machine's.
        let mine = fs::read(node.key("c")).unwrap();
        node.on("c", "p1")
            .args(["key", "recover", "--refresh"])
            .assert()
            .failure()
            .stderr(predicate::str::contains(format!("not this machine's key {other}")));
        assert_eq!(fs::read(node.key("c")).unwrap(), mine);
        assert_eq!(node.server_copy().unwrap(), held);
    }

    /// The version-1 vector of `qsm-crypt/tests/vectors.rs` (passphrase `qsm test vector`):
    /// a key file from before version 2.
    const KEY_FILE_V1: &str = "51534d4b01010100080000000100000001000000dab17a93ba04eb09fc4a89762d473a058093a50a179962d94f2b775fc6d9cdbc20bf89aa0d4001613e03f9893680c08d01e866d4f9117aa9e1aa4751d6b1d04d49e9ff89c5622743e99409b3";

    /// Machines that still hold a version-1 key file: the server's rewrapped copy (version 2)
    /// is newer than it; `recover --refresh` asks the old passphrase, since a version-1 file
    /// does not say which key it holds.
    fn a_version_1_key_file_is_refreshed_with_its_own_passphrase(node: &Node) {
        let src = source(node);
        let v1: Vec<u8> = (0..KEY_FILE_V1.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&KEY_FILE_V1[i..i + 2], 16).unwrap())
            .collect();
        node.file("v1", "qsm test vector");
        for machine in ["a", "b"] {
            fs::create_dir_all(node.key(machine).parent().unwrap()).unwrap();
            fs::write(node.key(machine), &v1).unwrap();
            fs::set_permissions(node.key(machine), fs::Permissions::from_mode(0o600)).unwrap();
        }
        node.backup("a", "v1", &src);
        assert_eq!(node.server_copy().unwrap(), v1, "the first backup stores the key file");
        node.on("b", "v1")
            .env("QSM_NEW_PASSPHRASE_FILE", node.path("p2"))
            .args(["key", "change-passphrase"])
            .assert()
            .success()
            .stdout(predicate::str::contains("rewrapped too"));
        let rewrapped = fs::read(node.key("b")).unwrap();
        assert_eq!(rewrapped.len(), 120, "a version-1 file is written back as version 2");
        assert_eq!(node.server_copy().unwrap(), rewrapped);
        let said = node.backup("a", "v1", &src);
        assert!(said.contains("under a newer passphrase") && said.contains("version-1"), "{said}");
        // With a wrong old passphrase, nothing is written (and the message says why it is
        // asked).
        node.on("a", "p2")
            .env("QSM_OLD_PASSPHRASE_FILE", node.path("p1"))
            .args(["key", "recover", "--refresh"])
            .assert()
            .failure()
            .stderr(
                predicate::str::contains("wrong passphrase")
                    .and(predicate::str::contains("version-1")),
            );
        assert_eq!(fs::read(node.key("a")).unwrap(), v1);
        node.on("a", "p2")
            .env("QSM_OLD_PASSPHRASE_FILE", node.path("v1"))
            .args(["key", "recover", "--refresh"])
            .assert()
            .success();
        assert_eq!(fs::read(node.key("a")).unwrap(), rewrapped);
        assert_eq!(node.fingerprint("a", "p2"), "4ef6-b1c6-c005-ee3b-3238-1fff-639d-abae");
    }

    /// A passphrase changed where the store could not be reached leaves the server's copy
    /// older: backups say so, and `upload --replace` (only with --replace) puts the newer one.
    fn an_older_wrapping_on_the_server_is_replaced_only_when_asked(node: &Node) {
        let src = source(node);
        node.backup("a", "p1", &src);
        let old = node.server_copy().unwrap();
        // No store configured for this command: the local file alone changes.
        node.on("a", "p1")
            .env("QSM_NEW_PASSPHRASE_FILE", node.path("p2"))
            .env("QSM_HOME", node.path("nowhere"))
            .env_remove("QSM_SERVER")
            .args(["key", "change-passphrase"])
            .assert()
            .success();
        assert_eq!(node.server_copy().unwrap(), old);
        let said = node.backup("a", "p2", &src);
        assert!(said.contains("older passphrase still opens it"), "{said}");
        assert!(said.contains("qsm key upload --replace"), "{said}");
        assert_eq!(node.server_copy().unwrap(), old, "a backup replaced an unverified copy");
        // Refreshing from it would go back to the old passphrase here: refused.
        let mine = fs::read(node.key("a")).unwrap();
        node.on("a", "p1")
            .args(["key", "recover", "--refresh"])
            .assert()
            .failure()
            .stderr(predicate::str::contains("go back to an older wrapping"));
        assert_eq!(fs::read(node.key("a")).unwrap(), mine);
        node.on("a", "p2")
            .args(["key", "upload"])
            .assert()
            .failure()
            .stderr(predicate::str::contains("--replace puts this machine's wrapping"));
        assert_eq!(node.server_copy().unwrap(), old);
        node.on("a", "p2").args(["key", "upload", "--replace"]).assert().success();
        assert_eq!(node.server_copy().unwrap(), fs::read(node.key("a")).unwrap());
        // The server's copy now opens with the new passphrase only.
        node.on("d", "p1").args(["key", "recover"]).assert().failure();
        node.on("d", "p2").args(["key", "recover"]).assert().success();
    }

    /// A machine whose clock is behind still stamps its new wrapping after the one it
    /// replaces, so the others take it rather than put theirs back: here A's key file says it
    /// was wrapped an hour from now (A's clock ahead), and B changes the passphrase.
    fn a_clock_behind_does_not_make_a_new_passphrase_look_old(node: &Node) {
        let src = source(node);
        let key = qsm_crypt::MasterKey::generate().unwrap();
        let ahead = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
        let file = key.wrap_at(b"the first passphrase", qsm_crypt::KdfParams::TEST, ahead).unwrap();
        fs::create_dir_all(node.key("a").parent().unwrap()).unwrap();
        fs::write(node.key("a"), file.as_bytes()).unwrap();
        fs::set_permissions(node.key("a"), fs::Permissions::from_mode(0o600)).unwrap();
        node.backup("a", "p1", &src);
        node.backup("b", "p1", &src);
        node.on("b", "p1")
            .env("QSM_NEW_PASSPHRASE_FILE", node.path("p2"))
            .args(["key", "change-passphrase"])
            .assert()
            .success();
        let rewrapped = qsm_crypt::KeyFile::from_bytes(&node.server_copy().unwrap()).unwrap();
        assert!(rewrapped.claimed_wrapped_at().unwrap() > ahead, "{rewrapped:?}");
        let said = node.backup("a", "p1", &src);
        assert!(said.contains("under a newer passphrase"), "{said}");
        node.on("a", "p1")
            .args(["key", "upload", "--replace"])
            .assert()
            .failure()
            .stderr(predicate::str::contains("even --replace"));
    }

    #[test]
    fn issue_32_clock_behind_embedded() {
        a_clock_behind_does_not_make_a_new_passphrase_look_old(&Node::new(false));
    }

    #[test]
    fn issue_32_clock_behind_over_the_network() {
        a_clock_behind_does_not_make_a_new_passphrase_look_old(&Node::new(true));
    }

    #[test]
    fn issue_32_passphrase_change_embedded() {
        a_passphrase_changed_on_one_machine_reaches_the_others(&Node::new(false));
    }

    #[test]
    fn issue_32_passphrase_change_over_the_network() {
        a_passphrase_changed_on_one_machine_reaches_the_others(&Node::new(true));
    }

    #[test]
    fn issue_32_key_init_embedded() {
        key_init_refuses_a_second_key_unless_forced(&Node::new(false));
    }

    #[test]
    fn issue_32_key_init_over_the_network() {
        key_init_refuses_a_second_key_unless_forced(&Node::new(true));
    }

    #[test]
    fn issue_32_version_1_key_file_embedded() {
        a_version_1_key_file_is_refreshed_with_its_own_passphrase(&Node::new(false));
    }

    #[test]
    fn issue_32_version_1_key_file_over_the_network() {
        a_version_1_key_file_is_refreshed_with_its_own_passphrase(&Node::new(true));
    }

    #[test]
    fn issue_32_older_wrapping_embedded() {
        an_older_wrapping_on_the_server_is_replaced_only_when_asked(&Node::new(false));
    }

    #[test]
    fn issue_32_older_wrapping_over_the_network() {
        an_older_wrapping_on_the_server_is_replaced_only_when_asked(&Node::new(true));
    }
}

/// Issue 32.4: turning encryption on after plaintext backups, or replacing the key, used to
/// leave unchanged files stored as they were ("backed up 0, unchanged 3"): plaintext, or sealed
/// under a key the node no longer has. The next backup now sends them again, sealed, and says
/// so; with encryption off nothing is sent again for it.
#[test]
fn turning_encryption_on_or_replacing_the_key_seals_every_file_again() {
    let m = Machine::new();
    let src = m.path("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("a.txt"), "stored in the clear at first\n".repeat(100)).unwrap();
    fs::write(src.join("d/b.bin"), noise(300_000, 3)).unwrap();
    fs::write(src.join("empty"), b"").unwrap();
    let plain = m.json(&["backup"], &src);
    assert_eq!(plain["backed_up"], 5, "{plain}");
    m.qsm()
        .args(["restore", "--require-encryption", "--to"])
        .arg(m.path("refused"))
        .arg(&src)
        .assert()
        .failure();

    let on = m.json(&["backup", "--encryption", "on"], &src);
    assert_eq!((on["resealed"].as_u64(), on["backed_up"].as_u64()), (Some(2), Some(2)), "{on}");
    m.qsm()
        .args(["backup", "--encryption", "on"])
        .arg(&src)
        .assert()
        .success()
        .stdout(predicate::str::contains("sent again 0").not());
    let out = m.path("out");
    m.qsm()
        .args(["restore", "--require-encryption", "--to"])
        .arg(&out)
        .arg(&src)
        .assert()
        .success();
    diff(&src, &out);

    // A new key replaces the old one: everything is sealed again under it.
    fs::remove_file(m.path("home/.config/qsm/key")).unwrap();
    m.qsm().args(["key", "init", "--force"]).assert().success();
    m.qsm().args(["key", "upload", "--replace"]).assert().success();
    m.qsm()
        .args(["backup", "--encryption", "on"])
        .arg(&src)
        .assert()
        .success()
        .stdout(predicate::str::contains("sent again 2 unchanged files to seal them"));
    let out = m.path("out2");
    m.qsm()
        .args(["restore", "--require-encryption", "--to"])
        .arg(&out)
        .arg(&src)
        .assert()
        .success();
    diff(&src, &out);

    // Encryption off: what is sealed stays sealed, nothing is sent for it.
    let off = m.json(&["backup", "--encryption", "off"], &src);
    assert_eq!((off["resealed"].as_u64(), off["backed_up"].as_u64()), (Some(0), Some(0)), "{off}");
}

/// A private file at `p` holding `text` and a newline (a passphrase or a password).
fn private_file(p: PathBuf, text: &str) -> PathBuf {
    fs::write(&p, format!("{text}\n")).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    p
}
