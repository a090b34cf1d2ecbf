//! The change journal end to end: the real `qsm journal start` daemon watching a tree with
//! inotify, and `qsm backup` (embedded server) using it instead of a scan, or scanning and
//! saying why when the journal cannot be trusted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;
use std::time::Duration;

use assert_cmd::Command;
use tempfile::TempDir;

include!("suite/daemon.rs");

struct Env {
    _dir: TempDir,
    home: PathBuf,
    journal: PathBuf,
    src: PathBuf,
    out: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = TempDir::new().unwrap();
        let src = dir.path().join("src");
        for d in ["a", "b/deep", "gone/sub", "cache"] {
            fs::create_dir_all(src.join(d)).unwrap();
        }
        for (f, body) in [
            ("a/1.txt", "one"),
            ("a/2.txt", "two"),
            ("b/deep/3.txt", "three"),
            ("gone/x", "x"),
            ("gone/sub/y", "y"),
            ("top.txt", "top"),
            ("cache/c.txt", "excluded"),
        ] {
            fs::write(src.join(f), body.repeat(100)).unwrap();
        }
        Env {
            home: dir.path().join("home"),
            journal: dir.path().join("journal.db"),
            out: dir.path().join("out"),
            src,
            _dir: dir,
        }
    }

    /// Changes waiting in the journal (all roots).
    fn pending(&self) -> u64 {
        let out = Command::cargo_bin("qsm")
            .unwrap()
            .args(["journal", "status", "--json", "--journal"])
            .arg(&self.journal)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v.as_array().map_or(0, |a| a.iter().filter_map(|r| r["pending"].as_u64()).sum())
    }

    fn backup(&self, extra: &[&str]) -> serde_json::Value {
        // Let the daemon record what it saw (it writes a batch every 200 ms): wait until the
        // count of waiting changes holds still, however loaded the machine is.
        let mut last = u64::MAX;
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(400));
            let now = self.pending();
            if now == last {
                break;
            }
            last = now;
        }
        let out = Command::cargo_bin("qsm")
            .unwrap()
            .env("QSM_HOME", &self.home)
            .args(["backup", "--json", "--exclude", "cache/", "--journal"])
            .arg(&self.journal)
            .args(extra)
            .arg(&self.src)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0].clone()
    }

    fn restored_matches(&self) {
        let _ = fs::remove_dir_all(&self.out);
        Command::cargo_bin("qsm")
            .unwrap()
            .env("QSM_HOME", &self.home)
            .arg("restore")
            .arg(&self.src)
            .arg("--to")
            .arg(&self.out)
            .assert()
            .success();
        let diff = StdCommand::new("diff")
            .args(["-r", "-x", "cache"])
            .arg(&self.src)
            .arg(&self.out)
            .output()
            .unwrap();
        assert!(diff.status.success(), "{}", String::from_utf8_lossy(&diff.stdout));
    }
}

#[test]
fn a_running_journal_replaces_the_scan_and_anything_doubtful_falls_back_to_one() {
    let env = Env::new();
    let mut daemon = Daemon::start(&env.journal, &env.src);
    let first = env.backup(&[]);
    assert_eq!(first["journal_used"], false, "{first}");
    assert!(first["journal"].as_str().unwrap().contains("no backup was made"), "{first}");
    assert_eq!(first["backed_up"], 12, "six directories and six files: {first}");

    // Changes: a file edited, one renamed, a directory made with files, one removed whole.
    fs::write(env.src.join("a/1.txt"), "changed").unwrap();
    fs::rename(env.src.join("a/2.txt"), env.src.join("b/two.txt")).unwrap();
    fs::create_dir_all(env.src.join("new/inner")).unwrap();
    fs::write(env.src.join("new/inner/n.txt"), "new").unwrap();
    fs::remove_dir_all(env.src.join("gone")).unwrap();
    fs::write(env.src.join("cache/c.txt"), "still excluded").unwrap();
    fs::write(env.src.join("cache/new.txt"), "excluded too").unwrap();
    let second = env.backup(&[]);
    assert_eq!(second["journal_used"], true, "{second}");
    assert!(second["journal"].as_str().unwrap().contains("changes from the journal"), "{second}");
    // Not a scan: the unchanged files were never examined.
    assert!(second["examined"].as_u64().unwrap() < 12, "{second}");
    env.restored_matches();
    assert!(!env.out.join("cache").exists(), "an excluded directory's change was sent");

    // Nothing changed: nothing sent.
    let idle = env.backup(&[]);
    assert_eq!((idle["journal_used"].clone(), idle["backed_up"].clone()), (true.into(), 0.into()));

    // A backup without the journal changes the server's inventory behind it.
    fs::write(env.src.join("top.txt"), "edited while the journal was not used").unwrap();
    env.backup(&["--no-journal"]);
    fs::write(env.src.join("b/deep/3.txt"), "and again").unwrap();
    let behind = env.backup(&[]);
    assert_eq!(behind["journal_used"], false, "{behind}");
    assert!(behind["journal"].as_str().unwrap().contains("inventory changed"), "{behind}");
    env.restored_matches();

    // The daemon stopped: changes may go unseen, so the backup scans.
    daemon.stop();
    fs::write(env.src.join("a/1.txt"), "changed with nobody watching").unwrap();
    let dead = env.backup(&[]);
    assert_eq!(dead["journal_used"], false, "{dead}");
    assert!(dead["journal"].as_str().unwrap().contains("not running"), "{dead}");
    env.restored_matches();

    // Restarted: the first backup scans, the next uses it again.
    let _daemon = Daemon::start(&env.journal, &env.src);
    fs::write(env.src.join("new/late.txt"), "late").unwrap();
    let restarted = env.backup(&[]);
    assert!(restarted["journal"].as_str().unwrap().contains("restarted"), "{restarted}");
    fs::write(env.src.join("new/later.txt"), "later").unwrap();
    let again = env.backup(&[]);
    assert_eq!(again["journal_used"], true, "{again}");
    env.restored_matches();
    let status = Command::cargo_bin("qsm")
        .unwrap()
        .args(["journal", "status", "--json", "--journal"])
        .arg(&env.journal)
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status[0]["valid"], true, "{status}");
}

/// Issue 32: a journaled backup with an exclude consumed the changes it skipped, and the next
/// backup without it found nothing to do; excluded files stayed active with the journal, and
/// became inactive with a scan.
#[test]
fn changes_an_exclude_skipped_are_backed_up_by_the_next_backup_without_it() {
    let env = Env::new();
    let _daemon = Daemon::start(&env.journal, &env.src);
    for i in 0..3 {
        fs::write(env.src.join(format!("quick_{i}")), format!("quick {i}")).unwrap();
    }
    env.backup(&[]);
    env.backup(&[]); // the journal serves from now on
    fs::write(env.src.join("quick_1"), "changed").unwrap();
    fs::write(env.src.join("quick_new"), "new").unwrap();
    fs::write(env.src.join("top.txt"), "changed too").unwrap();
    let excluding = env.backup(&["--exclude", "quick_*"]);
    assert_eq!(excluding["backed_up"], 2, "top.txt and its directory: {excluding}");
    let active = |env: &Env| -> Vec<String> {
        let out = Command::cargo_bin("qsm")
            .unwrap()
            .env("QSM_HOME", &env.home)
            .args(["query", "backup", "--json"])
            .arg(&env.src)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut paths: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["path"].as_str().unwrap().to_owned())
            .filter(|p| p.contains("quick_"))
            .collect();
        paths.sort();
        paths
    };
    // Excluded: inactive, as a scan would leave them.
    assert_eq!(active(&env), Vec::<String>::new());
    let next = env.backup(&[]);
    assert_eq!(next["journal_used"], false, "{next}");
    assert!(next["journal"].as_str().unwrap().contains("patterns differ"), "{next}");
    assert_eq!(active(&env), ["quick_0", "quick_1", "quick_2", "quick_new"]);
    env.restored_matches();
    assert_eq!(fs::read_to_string(env.out.join("quick_1")).unwrap(), "changed");
    // Same patterns again: the journal serves.
    fs::write(env.src.join("quick_2"), "changed again").unwrap();
    assert_eq!(env.backup(&[])["journal_used"], true);
}

/// A small deterministic generator (xorshift64*), so a failing run names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The active inventory of `src` in the store at `home`: path, kind, size, mode and mtime.
fn inventory(home: &Path, src: &Path) -> Vec<String> {
    let out = Command::cargo_bin("qsm")
        .unwrap()
        .env("QSM_HOME", home)
        .args(["query", "backup", "--json"])
        .arg(src)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut rows: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!("{} {} {} {} {}", r["path"], r["kind"], r["size"], r["mode"], r["mtime_ns"])
        })
        .collect();
    rows.sort();
    rows
}

/// Issue 32's property: after any sequence of edits and of journaled or scanning backups, each
/// with its own include/exclude patterns, the inventory is what a fresh scanning backup of the
/// tree with the same patterns makes. Steps: `QSM_JOURNAL_STEPS` (200 by default).
#[test]
fn journaled_backups_with_any_patterns_leave_the_inventory_a_scan_would() {
    let steps: usize =
        std::env::var("QSM_JOURNAL_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let seed: u64 = std::env::var("QSM_JOURNAL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64 * 0x9E37_79B9 + 1);
    eprintln!("journal property test: seed {seed} (QSM_JOURNAL_SEED), {steps} steps");
    let mut rng = Rng(seed | 1);
    let env = Env::new();
    let _daemon = Daemon::start(&env.journal, &env.src);
    let db = rusqlite::Connection::open(&env.journal).unwrap();
    let patterns: &[&[&str]] = &[
        &[],
        &[],
        &["--exclude", "quick_*"],
        &["--exclude", "b/"],
        &["--exclude", "*.txt"],
        &["--include", "*.txt"],
        &["--include", "a/**", "--exclude", "a/x*"],
    ];
    let mut current = patterns[0];
    let mut journaled = 0;
    let dirs = ["", "a", "b", "b/deep", "n"];
    let names = ["quick_1", "quick_2", "x1.txt", "f.txt", "g"];
    for step in 0..steps {
        // Edits: write, remove, make or remove a directory, rename.
        for _ in 0..1 + rng.below(3) {
            let dir = env.src.join(dirs[rng.below(dirs.len())]);
            let path = dir.join(names[rng.below(names.len())]);
            match rng.below(6) {
                0..=2 => {
                    let _ = fs::create_dir_all(&dir);
                    let _ = fs::write(&path, format!("step {step} {}", rng.next()));
                }
                3 => {
                    let _ = fs::remove_file(&path);
                }
                4 => {
                    let to = env
                        .src
                        .join(dirs[rng.below(dirs.len())])
                        .join(names[rng.below(names.len())]);
                    if !to.is_dir() {
                        let _ = fs::rename(&path, &to);
                    }
                }
                _ => {
                    if dir != env.src && rng.below(3) == 0 {
                        let _ = fs::remove_dir_all(&dir);
                    } else {
                        let _ = fs::create_dir_all(dir.join("sub"));
                    }
                }
            }
        }
        // A new marker, written last: once the journal lists it, it holds every edit above
        // (inotify reports one watcher's events in order).
        let marker = format!("marker-{step}");
        fs::write(env.src.join(&marker), "").unwrap();
        let _ = fs::remove_file(env.src.join(format!("marker-{}", step.wrapping_sub(1))));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while db
            .query_row("SELECT count(*) FROM changes WHERE rel = ?1", [marker.as_bytes()], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap_or(0)
            == 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "step {step}: the daemon never recorded {marker}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Often the same patterns as the step before, so the journal serves many steps.
        if rng.below(2) == 0 {
            current = patterns[rng.below(patterns.len())];
        }
        let chosen = current;
        let scan = rng.below(4) == 0;
        let mut args: Vec<&str> = chosen.to_vec();
        if scan {
            args.push("--no-journal");
        }
        let out = Command::cargo_bin("qsm")
            .unwrap()
            .env("QSM_HOME", &env.home)
            .args(["backup", "--json", "--journal"])
            .arg(&env.journal)
            .args(&args)
            .arg(&env.src)
            .output()
            .unwrap();
        assert!(out.status.success(), "step {step}: {}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        journaled += usize::from(report[0]["journal_used"] == true);
        let fresh = TempDir::new().unwrap();
        Command::cargo_bin("qsm")
            .unwrap()
            .env("QSM_HOME", fresh.path())
            .args(["backup", "--no-journal"])
            .args(chosen)
            .arg(&env.src)
            .assert()
            .success();
        let (got, want) = (inventory(&env.home, &env.src), inventory(fresh.path(), &env.src));
        assert_eq!(
            got,
            want,
            "step {step} (seed {seed}), backup {args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    eprintln!("{journaled} of {steps} backups used the journal");
    assert!(journaled * 8 >= steps, "only {journaled} of {steps} backups used the journal");
}

impl Env {
    /// `qsm journal status` as the next backup (`--exclude cache/`, this store) would see it.
    fn status(&self, json: bool) -> std::process::Output {
        let mut c = Command::cargo_bin("qsm").unwrap();
        c.env("QSM_HOME", &self.home)
            .env_remove("QSM_SERVER")
            .args(["journal", "status", "--exclude", "cache/", "--journal"])
            .arg(&self.journal);
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out
    }
}

/// Issue 32, point 6: after the daemon was killed and restarted, `journal status` no longer
/// says only "valid, 0 changes pending": it says the next backup scans, and why; once a
/// backup has made the journal serve, it says the next one uses it.
#[test]
fn journal_status_says_what_the_next_backup_will_do() {
    let env = Env::new();
    let mut daemon = Daemon::start(&env.journal, &env.src);
    env.backup(&[]);
    fs::write(env.src.join("top.txt"), "edited").unwrap();
    // Let the daemon record the edit (backup() waits for the journal to settle).
    assert_eq!(env.backup(&[])["journal_used"], true);
    let text = String::from_utf8(env.status(false).stdout).unwrap();
    assert!(text.contains("next backup to embedded store"), "{text}");
    assert!(text.contains("uses the journal (0 changes)"), "{text}");

    daemon.stop();
    let _daemon = Daemon::start(&env.journal, &env.src);
    let text = String::from_utf8(env.status(false).stdout).unwrap();
    assert!(text.contains("scans: the journal daemon restarted since the last backup"), "{text}");
    let json: serde_json::Value = serde_json::from_slice(&env.status(true).stdout).unwrap();
    let next = &json[0]["next_backup"][0];
    assert_eq!(next["uses_journal"], false, "{json}");
    assert!(next["why"].as_str().unwrap().contains("restarted"), "{json}");
    // What it said holds: the backup scans, and the one after uses the journal again.
    let scanned = env.backup(&[]);
    assert!(scanned["journal"].as_str().unwrap().contains("restarted"), "{scanned}");
    let text = String::from_utf8(env.status(false).stdout).unwrap();
    assert!(text.contains("uses the journal"), "{text}");
    // Asked with other patterns than the last backup's, it says that backup would scan.
    let other = Command::cargo_bin("qsm")
        .unwrap()
        .env("QSM_HOME", &env.home)
        .env_remove("QSM_SERVER")
        .args(["journal", "status", "--journal"])
        .arg(&env.journal)
        .output()
        .unwrap();
    let other = String::from_utf8(other.stdout).unwrap();
    assert!(other.contains("scans: the include/exclude patterns differ"), "{other}");
}

/// Issue 32, point 6: with a journal in place, a backup of a tree it does not watch prints no
/// "journal: scanned" line unless asked to be verbose; --json keeps the field.
#[test]
fn a_tree_not_journaled_is_mentioned_only_when_verbose() {
    let env = Env::new();
    let _daemon = Daemon::start(&env.journal, &env.src);
    env.backup(&[]);
    let other = env.src.parent().unwrap().join("other");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("f"), "f").unwrap();
    let run = |extra: &[&str]| {
        let out = Command::cargo_bin("qsm")
            .unwrap()
            .env("QSM_HOME", &env.home)
            .env_remove("QSM_SERVER")
            .args(["backup", "--journal"])
            .arg(&env.journal)
            .args(extra)
            .arg(&other)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let quiet = run(&[]);
    assert!(!quiet.contains("journal:"), "{quiet}");
    let verbose = run(&["--verbose"]);
    assert!(
        verbose.contains("journal: scanned:") && verbose.contains("is not journaled"),
        "{verbose}"
    );
    let json: serde_json::Value = serde_json::from_str(&run(&["--json"])).unwrap();
    assert!(json[0]["journal"].as_str().unwrap().contains("is not journaled"), "{json}");
    // A journaled tree still says how the journal served.
    let journaled = Command::cargo_bin("qsm")
        .unwrap()
        .env("QSM_HOME", &env.home)
        .env_remove("QSM_SERVER")
        .args(["backup", "--exclude", "cache/", "--journal"])
        .arg(&env.journal)
        .arg(&env.src)
        .output()
        .unwrap();
    let journaled = String::from_utf8(journaled.stdout).unwrap();
    assert!(journaled.contains("journal: "), "{journaled}");
}

/// Issue 32, point 5: a backup of a subdirectory of a journaled tree goes into the tree's
/// filespace, scans only the subdirectory, consumes none of the journal's changes, and leaves
/// the journal serving the next backup of the whole tree (its changes elsewhere are sent).
#[test]
fn a_subdirectory_backup_keeps_the_journal_of_its_filespace() {
    let env = Env::new();
    let _daemon = Daemon::start(&env.journal, &env.src);
    env.backup(&[]);
    assert_eq!(env.backup(&[])["journal_used"], true);
    fs::write(env.src.join("a/1.txt"), "edited in a").unwrap();
    fs::write(env.src.join("b/deep/3.txt"), "edited in b").unwrap();
    let sub = env.backup_of(&env.src.join("a"));
    assert_eq!(sub["subtree"], "a", "{sub}");
    assert_eq!(sub["journal_used"], false, "{sub}");
    assert_eq!(sub["backed_up"], 1, "a/1.txt only: {sub}");
    // The journal still serves, and still holds both changes: b's is sent now.
    let whole = env.backup(&[]);
    assert_eq!(whole["journal_used"], true, "{whole}");
    env.restored_matches();
}

impl Env {
    /// A backup of `path` (below the journaled tree) with the patterns of `backup`, once the
    /// daemon has recorded what changed.
    fn backup_of(&self, path: &Path) -> serde_json::Value {
        let mut last = u64::MAX;
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(400));
            let now = self.pending();
            if now == last {
                break;
            }
            last = now;
        }
        let out = Command::cargo_bin("qsm")
            .unwrap()
            .env("QSM_HOME", &self.home)
            .env_remove("QSM_SERVER")
            .args(["backup", "--json", "--exclude", "cache/", "--journal"])
            .arg(&self.journal)
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0].clone()
    }
}

/// Issue 32.4 with the journal: encryption turned on makes the next backup scan, so unchanged
/// files stored in the clear are sealed again (the journal lists only what changed).
#[test]
fn encryption_turned_on_scans_past_the_journal_and_seals_every_file() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let _daemon = Daemon::start(&env.journal, &env.src);
    env.backup(&[]);
    assert_eq!(env.backup(&[])["journal_used"], true);
    let pass = env.home.with_extension("pass");
    fs::write(&pass, "a passphrase for the journal test\n").unwrap();
    fs::set_permissions(&pass, fs::Permissions::from_mode(0o600)).unwrap();
    let key = env.home.with_extension("key");
    let encrypted = || {
        let out = Command::cargo_bin("qsm")
            .unwrap()
            .env("QSM_HOME", &env.home)
            .env("QSM_PASSPHRASE_FILE", &pass)
            .env("QSM_KEY_FILE", &key)
            .args(["backup", "--json", "--encryption", "on", "--exclude", "cache/", "--journal"])
            .arg(&env.journal)
            .arg(&env.src)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0].clone()
    };
    let on = encrypted();
    assert_eq!(on["journal_used"], false, "{on}");
    assert!(on["journal"].as_str().unwrap().contains("the key it sealed with"), "{on}");
    assert_eq!(on["resealed"], 6, "every file with data: {on}");
    // Same key again: the journal serves.
    assert_eq!(encrypted()["journal_used"], true);
}
