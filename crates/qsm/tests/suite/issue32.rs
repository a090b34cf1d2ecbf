// Issue 32, points 5 and 7, as scenarios run against the embedded store (backup.rs) and
// through a server (suite/network.rs). `qsm` makes a client command for the store under test;
// `home` is the HOME those commands run with (client state goes below it).

/// The JSON a command prints, after checking it succeeded.
fn issue32_json(mut cmd: Command) -> serde_json::Value {
    let out = cmd.arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The active backup paths of filespace `fs`.
fn issue32_active(qsm: &dyn Fn() -> Command, fs: &str) -> Vec<String> {
    let mut c = qsm();
    c.args(["query", "backup"]);
    let rows = issue32_json(c);
    let mut paths: Vec<String> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["filespace"] == fs)
        .map(|r| r["path"].as_str().unwrap().to_owned())
        .collect();
    paths.sort();
    paths
}

/// Point 5: a path below a filespace is backed up into it, as an incremental of that subtree
/// only; `--filespace` with the path's own name makes it a filespace of its own.
fn issue32_a_subdirectory_is_backed_up_into_its_filespace(dir: &Path, qsm: &dyn Fn() -> Command) {
    let s = dir.join("S");
    fs::create_dir_all(s.join("a/deep")).unwrap();
    fs::create_dir_all(s.join("b")).unwrap();
    fs::write(s.join("a/x"), "x").unwrap();
    fs::write(s.join("a/deep/y"), "y").unwrap();
    fs::write(s.join("b/z"), "z").unwrap();
    let name = s.canonicalize().unwrap().to_str().unwrap().to_owned();
    let backup = |path: &Path, extra: &[&str]| {
        let mut c = qsm();
        c.arg("backup").args(extra).arg(path);
        issue32_json(c)[0].clone()
    };
    let first = backup(&s, &[]);
    assert_eq!(first["backed_up"], 7, "{first}");

    // Nothing below `a` is sent again, and no second filespace appears.
    let sub = backup(&s.join("a"), &[]);
    assert_eq!(sub["filespace"], name.as_str(), "{sub}");
    assert_eq!(sub["subtree"], "a", "{sub}");
    assert_eq!((sub["backed_up"].as_u64(), sub["unchanged"].as_u64()), (Some(0), Some(4)), "{sub}");
    let mut c = qsm();
    c.args(["query", "filespace"]);
    assert_eq!(issue32_json(c).as_array().unwrap().len(), 1);
    let mut c = qsm();
    c.arg("backup").arg(s.join("a"));
    c.assert().success().stdout(predicate::str::contains(format!("(in filespace {name})")));

    // Only the subtree is compared: what went outside it stays active.
    fs::remove_file(s.join("a/deep/y")).unwrap();
    fs::remove_file(s.join("b/z")).unwrap();
    fs::write(s.join("a/x"), "x, edited").unwrap();
    let sub = backup(&s.join("a"), &[]);
    assert_eq!(sub["deactivated"], 1, "{sub}");
    let active = issue32_active(qsm, &name);
    assert!(active.contains(&"b/z".to_owned()), "{active:?}");
    assert!(!active.contains(&"a/deep/y".to_owned()), "{active:?}");
    assert!(active.contains(&"a/x".to_owned()), "{active:?}");

    // Restore of S/a finds it in S (placed as below S's root), with the edit.
    let out = dir.join("out-a");
    qsm().arg("restore").arg(s.join("a")).arg("--to").arg(&out).assert().success();
    assert_eq!(fs::read(out.join("a/x")).unwrap(), b"x, edited");
    assert!(!out.join("b").exists());

    // An archive of S/a goes into S too, and is retrieved from there.
    qsm()
        .arg("archive")
        .arg(s.join("a"))
        .args(["-d", "a alone"])
        .assert()
        .success()
        .stdout(predicate::str::contains(format!("(in filespace {name})")));
    let mut c = qsm();
    c.args(["query", "filespace"]);
    assert_eq!(issue32_json(c).as_array().unwrap().len(), 1);
    let out = dir.join("retrieved-a");
    qsm()
        .arg("retrieve")
        .arg(s.join("a"))
        .args(["-d", "a alone", "--to"])
        .arg(&out)
        .assert()
        .success();
    assert_eq!(fs::read(out.join("a/x")).unwrap(), b"x, edited");
    assert!(!out.join("b").exists());

    // Its own name makes it a filespace of its own; any other name is refused.
    let own = s.join("a").canonicalize().unwrap();
    let separate = backup(&s.join("a"), &["--filespace", own.to_str().unwrap()]);
    assert_eq!(separate["filespace"], own.to_str().unwrap(), "{separate}");
    assert_eq!(separate["backed_up"], 3, "{separate}");
    let mut c = qsm();
    c.args(["query", "filespace"]);
    assert_eq!(issue32_json(c).as_array().unwrap().len(), 2);
    qsm()
        .arg("backup")
        .arg(s.join("a"))
        .arg("--filespace")
        .arg(s.join("b"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("is not at or below it"));
}

/// Point 7: two archives with one description are listed apart with their dates and ids,
/// `retrieve -d` takes the newest whole (never a path-by-path merge) and says so, `--id`
/// takes another, and reusing a description warns.
fn issue32_archives_of_one_description_are_told_apart(dir: &Path, qsm: &dyn Fn() -> Command) {
    let p = dir.join("P");
    fs::create_dir_all(&p).unwrap();
    fs::write(p.join("one.txt"), "release one, first cut").unwrap();
    fs::write(p.join("old.txt"), "only in the first").unwrap();
    qsm()
        .arg("archive")
        .arg(&p)
        .args(["-d", "release 1.0"])
        .assert()
        .success()
        .stderr(predicate::str::contains("already holds").not());
    fs::write(p.join("one.txt"), "release one, second cut").unwrap();
    fs::remove_file(p.join("old.txt")).unwrap();
    fs::write(p.join("new.txt"), "only in the second").unwrap();
    qsm()
        .arg("archive")
        .arg(&p)
        .args(["-d", "release 1.0"])
        .assert()
        .success()
        .stderr(predicate::str::contains("already holds 1 archive(s) described \"release 1.0\""));

    let mut c = qsm();
    c.args(["query", "archive"]);
    let rows = issue32_json(c);
    let mut ids: Vec<i64> =
        rows.as_array().unwrap().iter().map(|r| r["archive"].as_i64().unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 2, "{rows}");
    assert!(rows.as_array().unwrap().iter().all(|r| r["archived"].as_i64().is_some()), "{rows}");
    let first = ids[0];
    qsm()
        .args(["query", "archive"])
        .assert()
        .success()
        .stdout(predicate::str::contains(format!("archive {first} of 20")));

    // The newest, whole: its files, and none of the other's.
    let out = dir.join("newest");
    qsm()
        .arg("retrieve")
        .arg(&p)
        .args(["-d", "release 1.0", "--to"])
        .arg(&out)
        .assert()
        .success()
        .stderr(predicate::str::contains("2 archives of"))
        .stderr(predicate::str::contains("retrieving the newest"));
    assert_eq!(fs::read(out.join("one.txt")).unwrap(), b"release one, second cut");
    assert!(out.join("new.txt").exists());
    assert!(!out.join("old.txt").exists(), "two archives merged");

    // The older one by id, alone.
    let out = dir.join("older");
    qsm()
        .arg("retrieve")
        .arg(&p)
        .args(["--id", &first.to_string(), "--to"])
        .arg(&out)
        .assert()
        .success();
    assert_eq!(fs::read(out.join("one.txt")).unwrap(), b"release one, first cut");
    assert!(out.join("old.txt").exists());
    assert!(!out.join("new.txt").exists(), "two archives merged");
    qsm()
        .arg("retrieve")
        .arg(&p)
        .args(["--id", "987654321", "--to"])
        .arg(dir.join("none"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("no archive 987654321"));
}

/// Point 7: everything the client keeps under `home` (and `store`, the embedded store's
/// directory, if any) is owner-only: after a deduplicated, encrypted backup there are a key
/// file, a dedup cache and their directories.
fn issue32_client_state_is_owner_only(
    dir: &Path,
    home: &Path,
    store: Option<&Path>,
    qsm: &dyn Fn() -> Command,
) {
    use std::os::unix::fs::MetadataExt;
    let src = dir.join("private-src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), "data".repeat(1000)).unwrap();
    let pass = dir.join("passphrase");
    fs::write(&pass, "a long enough passphrase\n").unwrap();
    fs::set_permissions(&pass, fs::Permissions::from_mode(0o600)).unwrap();
    qsm()
        .env("QSM_PASSPHRASE_FILE", &pass)
        .env_remove("QSM_KEY_FILE")
        .args(["backup", "--dedup", "on", "--encryption", "on"])
        .arg(&src)
        .assert()
        .success();
    let mut seen = Vec::new();
    if let Some(store) = store {
        for p in [store.to_path_buf(), store.join("dedup.cache")] {
            let mode = fs::metadata(&p).unwrap().mode();
            assert_eq!(mode & 0o077, 0, "{} is {:o}", p.display(), mode & 0o777);
        }
    }
    let mut stack: Vec<std::path::PathBuf> = [".config/qsm", ".cache/qsm", ".local/state/qsm"]
        .iter()
        .map(|d| home.join(d))
        .filter(|d| d.exists())
        .collect();
    while let Some(p) = stack.pop() {
        let meta = fs::symlink_metadata(&p).unwrap();
        assert_eq!(meta.mode() & 0o077, 0, "{} is {:o}", p.display(), meta.mode() & 0o777);
        if meta.is_dir() {
            stack.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
        seen.push(p);
    }
    assert!(seen.iter().any(|p| p.ends_with(".config/qsm/key")), "no key file: {seen:?}");
}
