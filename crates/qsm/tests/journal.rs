//! The change journal end to end: the real `qsm journal start` daemon watching a tree with
//! inotify, and `qsm backup` (embedded server) using it instead of a scan, or scanning and
//! saying why when the journal cannot be trusted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as StdCommand, Stdio};
use std::time::Duration;

use assert_cmd::Command;
use tempfile::TempDir;

struct Daemon(Child);

impl Daemon {
    fn start(journal: &Path, root: &Path) -> Daemon {
        let mut child = StdCommand::new(assert_cmd::cargo::cargo_bin("qsm"))
            .args(["journal", "start", "--journal"])
            .arg(journal)
            .arg(root)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("the daemon printed nothing").unwrap();
        assert!(first.contains("watching"), "{first}");
        std::thread::spawn(move || for _ in lines {});
        Daemon(child)
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

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
