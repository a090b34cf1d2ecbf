//! End-to-end tests of the `qsm` binary: the commands as a user runs them.

use std::fs;
use std::path::Path;

use assert_cmd::Command;
use predicates::prelude::*;
use tempfile::TempDir;

fn qsm() -> Command {
    match Command::cargo_bin("qsm") {
        Ok(c) => c,
        Err(e) => panic!("qsm binary not built: {e}"),
    }
}

fn text(len: usize) -> Vec<u8> {
    b"backup and archive with independent quanta; restore decodes out of order. "
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

fn write(dir: &TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.path().join(name);
    if let Err(e) = fs::write(&p, bytes) {
        panic!("{}: {e}", p.display());
    }
    p
}

fn read(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn file_round_trip_with_every_codec() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let data = text(300_000);
    let input = write(&dir, "in.txt", &data);
    for codec in
        ["auto", "none", "lz4", "zstd:-5", "zstd:19", "zlib:1", "gzip", "lzw", "lzo", "quicklz"]
    {
        let packed = dir.path().join(format!("{codec}.qsm"));
        let back = dir.path().join(format!("{codec}.out"));
        qsm()
            .args(["compress", "-q", "64K", "-c", codec])
            .arg(&input)
            .arg("-o")
            .arg(&packed)
            .assert()
            .success();
        qsm().arg("decompress").arg(&packed).arg("-o").arg(&back).assert().success();
        assert_eq!(read(&back), data, "{codec}");
    }
}

#[test]
fn stdin_to_stdout_round_trip() {
    let data = text(2_500_000);
    let packed = qsm()
        .args(["compress", "-T", "2"])
        .write_stdin(data.clone())
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(packed.len() < data.len() / 10);
    let back = qsm()
        .args(["decompress", "-"])
        .write_stdin(packed)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(back, data);
}

#[test]
fn info_reports_codecs_quanta_and_ratio() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let input = write(&dir, "in.txt", &text(1_000_000));
    let packed = dir.path().join("in.qsm");
    qsm()
        .args(["compress", "-c", "lz4", "-q", "256K"])
        .arg(&input)
        .arg("-o")
        .arg(&packed)
        .assert()
        .success();
    qsm().arg("info").arg(&packed).assert().success().stdout(
        predicate::str::contains("quanta:       4 of 262144 bytes")
            .and(predicate::str::contains("codec lz4")),
    );
    let out = qsm()
        .args(["info", "--json", "--quanta"])
        .arg(&packed)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["raw_bytes"], 1_000_000);
    assert_eq!(v["quanta"], 4);
    assert_eq!(v["codecs"][0]["codec"], "lz4");
    assert_eq!(v["quanta_list"][3]["raw_offset"], 3 * 262_144);
}

#[test]
fn range_of_quanta_and_test_mode() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let data = text(1_000_000);
    let input = write(&dir, "in.txt", &data);
    let packed = dir.path().join("in.qsm");
    qsm().args(["compress", "-q", "64K"]).arg(&input).arg("-o").arg(&packed).assert().success();
    let out = qsm()
        .args(["decompress", "--quanta", "2..5"])
        .arg(&packed)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(out, &data[2 * 65_536..5 * 65_536]);
    qsm()
        .args(["decompress", "-t"])
        .arg(&packed)
        .assert()
        .success()
        .stderr(predicate::str::contains("verified"));
    qsm()
        .args(["decompress", "--quanta", "10..99"])
        .arg(&packed)
        .assert()
        .failure()
        .stderr(predicate::str::contains("outside the stream's 16 quanta"));
}

#[test]
fn bad_arguments_get_clear_errors() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let input = write(&dir, "in.txt", b"hello");
    let out = dir.path().join("x.qsm");
    let cases: [(&[&str], &str); 5] = [
        (&["compress", "-c", "brotli"], "unknown codec \"brotli\""),
        (&["compress", "-c", "zstd", "-l", "23"], "level 23 is out of range for zstd"),
        (&["compress", "-c", "gzip:0"], "level 0 is out of range for gzip"),
        (&["compress", "-q", "1K"], "a quantum of 1024 bytes is outside 4096 to 16777216 bytes"),
        (&["compress", "-T", "0"], "--threads must be at least 1"),
    ];
    for (args, msg) in cases {
        qsm()
            .args(args)
            .arg(&input)
            .arg("-o")
            .arg(&out)
            .assert()
            .failure()
            .stderr(predicate::str::contains(msg));
        assert!(!out.exists(), "{args:?} left an output file");
    }
    qsm()
        .args(["compress", "/no/such/file", "-o"])
        .arg(&out)
        .assert()
        .failure()
        .stderr(predicate::str::contains("cannot open /no/such/file"));
    qsm()
        .args(["info", "/no/such/file.qsm"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("/no/such/file.qsm"));
}

#[test]
fn corrupt_input_names_the_quantum_and_leaves_no_output() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let data = text(500_000);
    let input = write(&dir, "in.txt", &data);
    let packed = dir.path().join("in.qsm");
    qsm()
        .args(["compress", "-c", "zstd", "-q", "64K"])
        .arg(&input)
        .arg("-o")
        .arg(&packed)
        .assert()
        .success();
    let mut bytes = read(&packed);
    // Find quantum 2 through the index and damage its payload.
    let info = qsm()
        .args(["info", "--json", "--quanta"])
        .arg(&packed)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&info).unwrap_or_else(|e| panic!("{e}"));
    let offset = v["quanta_list"][2]["frame_offset"].as_u64().unwrap_or_default() as usize;
    bytes[offset + 28 + 20] ^= 0x55;
    let bad = write(&dir, "bad.qsm", &bytes);
    let out = dir.path().join("restored.txt");
    qsm()
        .arg("decompress")
        .arg(&bad)
        .arg("-o")
        .arg(&out)
        .assert()
        .failure()
        .stderr(predicate::str::contains(format!("quantum 2 at byte offset {offset}")));
    assert!(!out.exists(), "a failed decompress left an output file");
    let leftovers: Vec<_> = fs::read_dir(dir.path())
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(leftovers.iter().all(|n| !n.to_string_lossy().contains("partial")), "{leftovers:?}");

    let whole = read(&packed);
    let truncated = write(&dir, "short.qsm", &whole[..whole.len() / 2]);
    qsm()
        .arg("decompress")
        .arg(&truncated)
        .arg("-o")
        .arg(&out)
        .assert()
        .failure()
        .stderr(predicate::str::contains("truncated"));
    assert!(!out.exists());
    let not_qsm = write(&dir, "plain.txt", b"just some text, not a stream of quanta");
    qsm()
        .arg("decompress")
        .arg(&not_qsm)
        .assert()
        .failure()
        .stderr(predicate::str::contains("not a QSM stream"));
}

#[test]
fn existing_output_is_kept_unless_forced() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let input = write(&dir, "in.txt", &text(10_000));
    let out = write(&dir, "out.qsm", b"precious");
    qsm()
        .arg("compress")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .assert()
        .failure()
        .stderr(predicate::str::contains("already exists"));
    assert_eq!(read(&out), b"precious");
    qsm().arg("compress").arg(&input).arg("-o").arg(&out).arg("--force").assert().success();
    assert_ne!(read(&out), b"precious");
}

#[test]
fn devices_are_written_in_place_not_replaced() {
    use std::os::unix::fs::FileTypeExt;
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let input = write(&dir, "in.txt", &text(100_000));
    qsm().arg("compress").arg(&input).args(["-o", "/dev/null", "--force"]).assert().success();
    let meta = fs::metadata("/dev/null").unwrap_or_else(|e| panic!("{e}"));
    assert!(meta.file_type().is_char_device(), "/dev/null was replaced");
}

#[test]
fn codecs_lists_permanent_ids() {
    let out = qsm().args(["codecs", "--json"]).assert().success().get_output().stdout.clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<(u64, String)> = v
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    (c["id"].as_u64().unwrap_or(999), c["name"].as_str().unwrap_or("").to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let expected = [
        (0, "none"),
        (1, "lz4"),
        (2, "zstd"),
        (3, "zlib"),
        (4, "gzip"),
        (5, "lzw"),
        (6, "lzo"),
        (7, "quicklz"),
    ];
    assert_eq!(ids, expected.map(|(i, n)| (i, n.to_owned())));
}

#[test]
fn stand_measures_a_plan_and_writes_json_and_csv() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let plan = dir.path().join("plan.toml");
    fs::write(
        &plan,
        "algorithms = [\"lz4\", \"quicklz\"]\nblock_sizes = [\"4K\", \"16K\"]\npatterns = [\"compressible:50\"]\nloads = [\"none\", \"cpu:1\"]\nbytes_per_cell = \"64K\"\nwarmup = 0\nrepetitions = 2\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (json, csv) = (dir.path().join("out.json"), dir.path().join("out.csv"));
    qsm()
        .args(["stand", "run"])
        .arg(&plan)
        .arg("--json")
        .arg(&json)
        .arg("--csv")
        .arg(&csv)
        .assert()
        .success()
        .stdout(
            predicate::str::contains("timer overhead")
                .and(predicate::str::contains("quicklz"))
                .and(predicate::str::contains("machine: ")),
        );
    let report: serde_json::Value =
        serde_json::from_slice(&read(&json)).unwrap_or_else(|e| panic!("{e}"));
    let cells = report["cells"].as_array().map(Vec::len).unwrap_or(0);
    // 2 algorithms x 2 operations x 2 block sizes x 2 loads.
    assert_eq!(cells, 16, "{report}");
    assert_eq!(report["cells"][1]["load"], "cpu:1@other");
    assert!(report["environment"]["cores"].as_u64().unwrap_or(0) >= 1, "{report}");
    assert!(report["cells"][1]["slowdown"].as_f64().is_some(), "{report}");
    // 16 blocks x 2 passes, one reading per batch when blocks are too fast to time alone.
    let per = report["cells"][0]["blocks_per_reading"].as_u64().unwrap_or(0);
    assert!((1..=16).contains(&per), "{report}");
    assert_eq!(report["cells"][0]["stats"]["samples"], 16 / per * 2, "{report}");
    let csv = String::from_utf8(read(&csv)).unwrap_or_default();
    assert_eq!(csv.lines().count(), 17, "{csv}");
    fs::write(&plan, "algorithms = [\"lz4\"]\nblock_sizes = [\"0\"]\npatterns = [\"random\"]\n")
        .unwrap_or_else(|e| panic!("{e}"));
    qsm()
        .args(["stand", "run"])
        .arg(&plan)
        .assert()
        .failure()
        .stderr(predicate::str::contains("block_sizes[0]: \"0\" is not a block size"));
}

#[test]
fn stand_plots_a_report_and_compares_two() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let plan = dir.path().join("plan.toml");
    fs::write(
        &plan,
        "algorithms = [\"aes-256-gcm\", \"blake3\"]\noperations = [\"encrypt\", \"decrypt\", \"hash\"]\nblock_sizes = [\"4K\", \"16K\"]\npatterns = [\"random\"]\nbytes_per_cell = \"64K\"\nwarmup = 0\nrepetitions = 2\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (json, plots) = (dir.path().join("a.json"), dir.path().join("plots"));
    qsm()
        .args(["stand", "run"])
        .arg(&plan)
        .arg("--json")
        .arg(&json)
        .arg("--plots")
        .arg(&plots)
        .assert()
        .success()
        .stdout(
            predicate::str::contains("aes-256-gcm").and(predicate::str::contains("plot files")),
        );
    // Per algorithm, operation, pattern and load: the block-size figure and one histogram,
    // each as SVG and PNG.
    let mut files: Vec<String> = fs::read_dir(&plots)
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()).unwrap_or_default())
        .collect();
    files.sort();
    assert_eq!(files.len(), 3 * 4, "{files:?}");
    assert!(files.contains(&"aes-256-gcm-encrypt-random-none.svg".to_owned()), "{files:?}");
    assert!(files.contains(&"blake3-hash-random-none-4096-histogram.png".to_owned()), "{files:?}");
    for f in &files {
        let bytes = read(&plots.join(f));
        if f.ends_with(".png") {
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{f}");
        } else {
            let text = String::from_utf8_lossy(&bytes);
            assert!(text.contains("<svg") && text.contains("</svg>"), "{f}");
        }
    }
    let svg = String::from_utf8(read(&plots.join("aes-256-gcm-encrypt-random-none.svg")))
        .unwrap_or_default();
    for label in ["min", "avg", "max", "block size", "16K"] {
        assert!(svg.contains(label), "{label} missing from the figure");
    }
    // The same report twice: nothing moved.
    qsm()
        .args(["stand", "compare"])
        .arg(&json)
        .arg(&json)
        .arg("--fail-on-slower")
        .assert()
        .success()
        .stdout(predicate::str::contains("6 cells in both: 0 slower and 0 faster"));
    // A later run whose AES-GCM encryption got twice as slow.
    let mut report: serde_json::Value =
        serde_json::from_slice(&read(&json)).unwrap_or_else(|e| panic!("{e}"));
    let p50 = report["cells"][0]["stats"]["p50_ns"].as_u64().unwrap_or(0);
    report["cells"][0]["stats"]["p50_ns"] = (p50 * 2).into();
    let slower = dir.path().join("b.json");
    fs::write(&slower, report.to_string()).unwrap_or_else(|e| panic!("{e}"));
    qsm()
        .args(["stand", "compare"])
        .arg(&json)
        .arg(&slower)
        .arg("--fail-on-slower")
        .assert()
        .code(1)
        .stdout(
            predicate::str::contains("aes-256-gcm encrypt 4096 random none")
                .and(predicate::str::contains("+100.0%"))
                .and(predicate::str::contains("1 slower")),
        );
    qsm()
        .args(["stand", "plot"])
        .arg(dir.path().join("missing.json"))
        .arg("--out")
        .arg(&plots)
        .assert()
        .failure()
        .stderr(predicate::str::contains("missing.json"));
}

#[test]
fn stand_load_keeps_a_core_busy_for_the_time_asked() {
    let bin = assert_cmd::cargo::cargo_bin("qsm");
    let mut child = std::process::Command::new(&bin)
        .args(["stand", "load", "cpu:1", "--seconds", "1.5"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    std::thread::sleep(std::time::Duration::from_secs(1));
    // utime and stime, in clock ticks (100 a second on Linux), after the command name.
    let stat = fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<u64> =
        after_name.split_whitespace().skip(11).take(2).filter_map(|f| f.parse().ok()).collect();
    let cpu = fields.iter().sum::<u64>() as f64 / 100.0;
    let status = child.wait().unwrap_or_else(|e| panic!("waiting for qsm stand load: {e}"));
    assert!(status.success(), "{status}");
    // A spinning thread for a second: most of a core even on a shared host.
    assert!(cpu >= 0.3, "{cpu} s of CPU in its first second ({stat})");
    qsm()
        .args(["stand", "load", "cpu:x"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("load cpu:x"));
    qsm()
        .args(["stand", "load", "cpu:1", "--seconds=0"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("--seconds"));
}

#[test]
fn key_init_fingerprint_and_passphrase_change() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let key = dir.path().join("conf/key");
    let pass = |name: &str, text: &str| {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.path().join(name);
        fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{e}"));
        p
    };
    let (old, new, wrong, short) = (
        pass("old", "old passphrase\n"),
        pass("new", "new passphrase"),
        pass("wrong", "nope nope"),
        pass("short", "abc"),
    );
    let key_cmd = |sub: &str, pass: &std::path::Path| {
        let mut c = qsm();
        c.args(["key", sub, "--key-file"])
            .arg(&key)
            .env("QSM_PASSPHRASE_FILE", pass)
            .env("QSM_HOME", dir.path().join("store"))
            .env_remove("QSM_SERVER");
        c
    };
    key_cmd("init", &short).assert().failure().stderr(predicate::str::contains("shorter than 8"));
    // A passphrase file others can read is refused, as a password file is (issue 23); so is
    // an empty one.
    let open = pass("open", "a readable passphrase");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&open, fs::Permissions::from_mode(0o644)).unwrap_or_else(|e| panic!("{e}"));
    key_cmd("init", &open)
        .assert()
        .failure()
        .stderr(predicate::str::contains("readable by others"));
    key_cmd("init", &pass("empty", "\n"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("is empty"));
    assert!(!key.exists());
    assert!(!key.exists());
    let out = key_cmd("init", &old).assert().success().get_output().stdout.clone();
    let out = String::from_utf8_lossy(&out);
    let fingerprint = out
        .lines()
        .find_map(|l| l.strip_prefix("fingerprint "))
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned();
    assert_eq!(fingerprint.len(), 39, "{fingerprint}");
    assert!(out.contains("Keep the passphrase safe"), "{out}");
    let mode = fs::metadata(&key).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
    assert_eq!(mode, 0o600);
    assert_eq!(read(&key).len(), 120, "a version-2 key file (FORMAT.md §12)");
    // A second init would lose the first key: refused, the file untouched.
    let before = read(&key);
    key_cmd("init", &new).assert().failure().stderr(predicate::str::contains("exists"));
    assert_eq!(read(&key), before);
    key_cmd("show-fingerprint", &old)
        .assert()
        .success()
        .stdout(predicate::str::diff(format!("{fingerprint}\n")));
    key_cmd("show-fingerprint", &wrong).assert().failure().stderr(
        predicate::str::contains("wrong passphrase").and(predicate::str::contains("conf/key")),
    );
    key_cmd("change-passphrase", &old)
        .env("QSM_NEW_PASSPHRASE_FILE", &new)
        .assert()
        .success()
        .stdout(predicate::str::contains(&fingerprint));
    // With no store to update, none is made.
    assert!(!dir.path().join("store").exists(), "a passphrase change created a store");
    key_cmd("show-fingerprint", &old)
        .assert()
        .failure()
        .stderr(predicate::str::contains("wrong passphrase"));
    key_cmd("show-fingerprint", &new)
        .assert()
        .success()
        .stdout(predicate::str::contains(&fingerprint));
    key_cmd("show-fingerprint", &new)
        .env("QSM_PASSPHRASE_FILE", dir.path().join("missing"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("missing"));
    // A damaged key file is named, not mistaken for a wrong passphrase when it can be told.
    fs::write(&key, b"not a key").unwrap_or_else(|e| panic!("{e}"));
    key_cmd("show-fingerprint", &new)
        .assert()
        .failure()
        .stderr(predicate::str::contains("not a QSM key file"));
}

/// Issue 23: no password or data in clear to another machine unless asked for.
#[test]
fn plain_http_is_refused_beyond_loopback_on_both_sides() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let pw = dir.path().join("pw");
    fs::write(&pw, "some-password\n").unwrap_or_else(|e| panic!("{e}"));
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&pw, fs::Permissions::from_mode(0o600)).unwrap_or_else(|e| panic!("{e}"));
    // Refused before any connection is tried (192.0.2.1 is a documentation address).
    qsm()
        .env("QSM_SERVER", "http://192.0.2.1:1500")
        .env("QSM_NODE", "n")
        .env("QSM_PASSWORD_FILE", &pw)
        .args(["query", "filespace"])
        .timeout(std::time::Duration::from_secs(20))
        .assert()
        .failure()
        .stderr(predicate::str::contains("in clear").and(predicate::str::contains("--insecure")));
    qsm()
        .args(["server", "--data-dir"])
        .arg(dir.path().join("srv"))
        .args(["--listen", "0.0.0.0:0", "--plaintext"])
        .timeout(std::time::Duration::from_secs(20))
        .assert()
        .failure()
        .stderr(predicate::str::contains("0.0.0.0:0").and(predicate::str::contains("--insecure")));
}

/// One row of the table below: what, arguments, environment, exit code, a fragment of stderr.
type Case<'a> = (&'a str, Vec<String>, Vec<(&'a str, String)>, i32, &'a str);

/// Arguments as the table holds them.
fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// A file only its owner can read, as secrets must be.
fn private(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap_or_else(|e| panic!("{e}"));
    p
}

/// Issue 31: bad option values and bad files, command by command: the documented exit code
/// (2 for bad usage, 0 when a value is only capped), a message naming what was wrong, and
/// never a panic. Every command that takes a number or reads a file has its rows; the admin
/// rows name a server that does not exist, so a value checked only after connecting would
/// fail as unreachable (exit 1) instead.
#[test]
fn bad_values_and_bad_files_exit_2_naming_them() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let d = dir.path();
    let src = d.join("src");
    fs::create_dir_all(&src).unwrap_or_else(|e| panic!("{e}"));
    fs::write(src.join("f"), "some data\n".repeat(1000)).unwrap_or_else(|e| panic!("{e}"));
    let empty = private(d, "empty", "");
    let garbage = private(d, "garbage", "this is not a certificate, a key or a password file\n");
    let pw = private(d, "pw", "a-password\n");
    let readable = d.join("readable");
    fs::write(&readable, "a-password\n").unwrap_or_else(|e| panic!("{e}"));
    let config = |name: &str, text: &str| {
        let p = d.join(name);
        fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
        p
    };
    let s = |p: &std::path::Path| p.to_str().unwrap_or_default().to_owned();
    let (src_s, garbage_s, empty_s, pw_s) = (s(&src), s(&garbage), s(&empty), s(&pw));
    let client_zero_txn = s(&config("client-txn.toml", "txn_group_max = 0\n"));
    let client_retries = s(&config("client-retries.toml", "changing_retries = 1000\n"));
    let client_cipher = s(&config("client-cipher.toml", "encryption = true\ncipher = \"rot13\"\n"));
    let server_idle = s(&config("server-idle.toml", "idle_timeout_minutes = 0\n"));
    let zero_block = s(&config(
        "plan.toml",
        "algorithms = [\"lz4\"]\nblock_sizes = [\"0\"]\npatterns = [\"random\"]\n",
    ));
    let endless = s(&config(
        "endless.toml",
        "algorithms = [\"lz4\"]\nblock_sizes = [\"4K\"]\npatterns = [\"random\"]\nrepetitions = 4000000000\n",
    ));
    let srv = s(&d.join("srv"));
    // A stream to decompress, and a small store with something in it to restore.
    let stream = d.join("s.qsm");
    qsm().args(["compress", "-o"]).arg(&stream).arg(src.join("f")).assert().success();
    let stream = s(&stream);
    let home = d.join("home");
    qsm()
        .env("QSM_HOME", &home)
        .env("HOME", d)
        .env_remove("QSM_SERVER")
        .arg("backup")
        .arg(&src)
        .assert()
        .success();
    let remote = |server: &str, password: &str, ca: Option<&str>| {
        let mut env = vec![
            ("QSM_SERVER", server.to_owned()),
            ("QSM_NODE", "n".to_owned()),
            ("QSM_PASSWORD_FILE", password.to_owned()),
        ];
        if let Some(ca) = ca {
            env.push(("QSM_CA", ca.to_owned()));
        }
        env
    };
    // Nothing answers there: a value refused only after connecting would exit 1.
    let nowhere = "http://127.0.0.1:9";
    let admin = |args: &[&str]| {
        let mut v = argv(&["admin", "--server", "unix:/nonexistent/qsm.sock"]);
        v.extend(argv(args));
        v
    };
    let none: Vec<(&str, String)> = Vec::new();
    let passphrase = vec![("QSM_PASSPHRASE_FILE", pw_s.clone())];
    // (what, arguments, environment, exit code, fragment of stderr)
    let cases: Vec<Case> = vec![
        // backup
        (
            "threads far beyond the cores",
            argv(&["backup", "-T", "18446744073709551615", &src_s]),
            none.clone(),
            0,
            "per core",
        ),
        ("no threads", argv(&["backup", "-T", "0", &src_s]), none.clone(), 2, "at least 1"),
        (
            "an unknown compression",
            argv(&["backup", "--compression", "zip:99", &src_s]),
            none.clone(),
            2,
            "--compression",
        ),
        (
            "a rate without a unit it knows",
            argv(&["backup", "--limit-upload", "10 parsecs", &src_s]),
            remote(nowhere, &pw_s, None),
            2,
            "unknown unit",
        ),
        (
            "a transaction of no objects",
            argv(&["backup", "--txn-group-max", "0", &src_s]),
            remote(nowhere, &pw_s, None),
            2,
            "0 is outside 1 to 65000 objects",
        ),
        (
            "a transaction past 32 GiB",
            argv(&["backup", "--txn-byte-limit", "99999999999999", &src_s]),
            remote(nowhere, &pw_s, None),
            2,
            "99999999999999 is outside 1 to 34359738368 bytes",
        ),
        (
            "endless retries",
            argv(&["backup", "--changing-retries", "4294967295", &src_s]),
            remote(nowhere, &pw_s, None),
            2,
            "outside 0 to 100 retries",
        ),
        (
            "dedup neither on nor off",
            argv(&["backup", "--dedup", "maybe", &src_s]),
            none.clone(),
            2,
            "on or off",
        ),
        (
            "a pattern that is none",
            argv(&["backup", "--exclude", "[", &src_s]),
            none.clone(),
            2,
            "exclude pattern \"[\"",
        ),
        (
            "a binding without a class",
            argv(&["backup", "--mgmtclass", "*.log", &src_s]),
            none.clone(),
            2,
            "write PATTERN=CLASS",
        ),
        (
            "a journal that is none",
            argv(&["backup", "--journal", &garbage_s, &src_s]),
            none.clone(),
            2,
            "is not a QSM change journal",
        ),
        (
            "a key file that is none, for encryption",
            argv(&["backup", "--encryption", "on", "--key-file", &garbage_s, &src_s]),
            passphrase.clone(),
            2,
            "not a QSM key file",
        ),
        (
            "a configuration that is none",
            argv(&["backup", "--config", &garbage_s, &src_s]),
            none.clone(),
            2,
            "the client configuration",
        ),
        (
            "a configuration's transaction of no objects",
            argv(&["backup", "--config", &client_zero_txn, &src_s]),
            none.clone(),
            2,
            "txn_group_max in the client configuration: 0 is outside 1 to 65000 objects",
        ),
        (
            "a configuration's endless retries",
            argv(&["backup", "--config", &client_retries, &src_s]),
            none.clone(),
            2,
            "changing_retries in the client configuration: 1000 is outside 0 to 100 retries",
        ),
        (
            "a configuration's cipher that is none",
            argv(&["backup", "--config", &client_cipher, &src_s]),
            passphrase.clone(),
            2,
            "cipher \"rot13\" in the client configuration",
        ),
        // restore, archive, retrieve
        (
            "a version id that none has",
            argv(&["restore", "--id=0", &src_s]),
            remote(nowhere, &pw_s, None),
            2,
            "0 is outside 1 to",
        ),
        (
            "a time that is none",
            argv(&["restore", "--pit", "yesterday", &src_s]),
            remote(nowhere, &pw_s, None),
            2,
            "invalid time",
        ),
        (
            "a key file that is none, to restore",
            argv(&["restore", "--key-file", &garbage_s, &src_s, "--to", &s(&d.join("out"))]),
            passphrase.clone(),
            2,
            "not a QSM key file",
        ),
        (
            "an archive kept for a number of days that is none",
            argv(&["archive", "-d", "x", "--retain-days", "forever", &src_s]),
            remote(nowhere, &pw_s, None),
            2,
            "\"forever\" is not a number: give 0 to 4294967294 days, or nolimit",
        ),
        (
            "an archive with an unknown compression",
            argv(&["archive", "-d", "x", "--compression", "rar", &src_s]),
            none.clone(),
            2,
            "--compression",
        ),
        (
            "an archive id that none has",
            argv(&["retrieve", "--id=-3", &src_s]),
            remote(nowhere, &pw_s, None),
            2,
            "(an archive id)",
        ),
        // query, and the connection every client command shares
        (
            "an empty password file",
            argv(&["query", "filespace"]),
            remote(nowhere, &empty_s, None),
            2,
            "is empty",
        ),
        (
            "a missing password file",
            argv(&["query", "filespace"]),
            remote(nowhere, &s(&d.join("nope")), None),
            2,
            "nope",
        ),
        (
            "a password file others can read",
            argv(&["query", "backup"]),
            remote(nowhere, &s(&readable), None),
            2,
            "readable by others",
        ),
        (
            "a CA that is no certificate",
            argv(&["query", "filespace"]),
            remote("https://127.0.0.1:9", &pw_s, Some(&garbage_s)),
            2,
            "no PEM certificate",
        ),
        (
            "https without a certificate to trust",
            argv(&["query", "archive"]),
            remote("https://127.0.0.1:9", &pw_s, None),
            2,
            "no certificate to trust",
        ),
        (
            "a server address of another scheme",
            argv(&["query", "backup"]),
            remote("ftp://127.0.0.1:9", &pw_s, None),
            2,
            "use https://HOST:PORT",
        ),
        (
            "a server but no node",
            argv(&["query", "filespace", "--server", nowhere, "--password-file", &pw_s]),
            none.clone(),
            2,
            "no node name",
        ),
        (
            "a query's configuration that is none",
            argv(&["query", "archive", "--config", &garbage_s]),
            none.clone(),
            2,
            "the client configuration",
        ),
        // server
        (
            "a server transaction of no objects",
            argv(&["server", "--data-dir", &srv, "--txn-group-max", "0"]),
            none.clone(),
            2,
            "0 is outside 1 to 65000 objects",
        ),
        (
            "a server transaction of no bytes",
            argv(&["server", "--data-dir", &srv, "--txn-byte-limit", "0"]),
            none.clone(),
            2,
            "0 is outside 1 to 34359738368 bytes",
        ),
        (
            "a server of no sessions",
            argv(&["server", "--data-dir", &srv, "--max-sessions", "0"]),
            none.clone(),
            2,
            "0 is outside 1 to 99999 sessions",
        ),
        (
            "a server configuration that is none",
            argv(&["server", "--data-dir", &srv, "--config", &garbage_s]),
            none.clone(),
            2,
            "server configuration",
        ),
        (
            "a server configuration ending sessions at once",
            argv(&["server", "--data-dir", &srv, "--config", &server_idle]),
            none.clone(),
            2,
            "idle_timeout_minutes 0 is outside 1 to 9999 minutes",
        ),
        (
            "a listen address without a port",
            argv(&["server", "--data-dir", &srv, "--listen", "localhost"]),
            none.clone(),
            2,
            "write HOST:PORT",
        ),
        (
            "a TLS certificate that is none",
            argv(&[
                "server",
                "--data-dir",
                &srv,
                "--listen",
                "127.0.0.1:0",
                "--tls-cert",
                &garbage_s,
                "--tls-key",
                &garbage_s,
            ]),
            none.clone(),
            2,
            "holds no PEM certificate",
        ),
        (
            "a catalog backup that is none",
            argv(&["server", "restore-db", "--data-dir", &srv, "--from", &garbage_s]),
            none.clone(),
            2,
            "not a catalog backup",
        ),
        (
            "the volume history with a configuration that is none",
            argv(&["server", "volhist", "--data-dir", &srv, "--config", &garbage_s]),
            none.clone(),
            2,
            "server configuration",
        ),
        // admin
        // Without a server, `qsm admin` administers the embedded store: one that does not
        // exist is not created by it.
        (
            "no server and no embedded store to administer",
            argv(&["admin", "--home", &s(&d.join("no-store")), "query", "node"]),
            none.clone(),
            2,
            "--server",
        ),
        (
            "an administrator without a password file",
            argv(&["admin", "--server", "https://127.0.0.1:9", "--admin", "a", "query", "node"]),
            none.clone(),
            2,
            "--admin needs --password-file",
        ),
        (
            "an administrator's empty password file",
            argv(&[
                "admin",
                "--server",
                "https://127.0.0.1:9",
                "--admin",
                "a",
                "--password-file",
                &empty_s,
                "query",
                "session",
            ]),
            none.clone(),
            2,
            "is empty",
        ),
        (
            "an administrator's CA that is no certificate",
            argv(&[
                "admin",
                "--server",
                "https://127.0.0.1:9",
                "--admin",
                "a",
                "--password-file",
                &pw_s,
                "--ca",
                &garbage_s,
                "query",
                "process",
            ]),
            none.clone(),
            2,
            "no PEM certificate",
        ),
        (
            "reclaim at no threshold",
            admin(&["reclaim", "stgpool", "--threshold", "0"]),
            none.clone(),
            2,
            "0 is outside 1 to 100 percent",
        ),
        (
            "expiration with too many workers",
            admin(&["expire", "inventory", "--resource", "65"]),
            none.clone(),
            2,
            "65 is outside 1 to 64 workers",
        ),
        (
            "expiration for no time",
            admin(&["expire", "inventory", "--duration", "0"]),
            none.clone(),
            2,
            "0 is outside 1 to 999999 minutes",
        ),
        (
            "an activity log of no entries",
            admin(&["query", "actlog", "--limit", "0"]),
            none.clone(),
            2,
            "0 is outside 1 to 100000 entries",
        ),
        (
            "an activity log from no time",
            admin(&["query", "actlog", "--since", "last week"]),
            none.clone(),
            2,
            "invalid time",
        ),
        (
            "an unknown privilege class",
            admin(&["register-admin", "x", "--privilege", "root"]),
            none.clone(),
            2,
            "unknown privilege class \"root\"",
        ),
        (
            "an unknown privilege class granted",
            admin(&["grant", "authority", "x", "--privilege", "policy,boss"]),
            none.clone(),
            2,
            "unknown privilege class \"boss\"",
        ),
        (
            "a node with a privilege class",
            admin(&["register-node", "x", "--privilege", "system"]),
            none.clone(),
            2,
            "a node has no privilege classes",
        ),
        (
            "a node's new password file that is empty",
            admin(&["register-node", "x", "--new-password-file", &empty_s]),
            none.clone(),
            2,
            "is empty",
        ),
        (
            "an administrator's new password file others can read",
            admin(&["update", "admin", "x", "--new-password-file", &s(&readable)]),
            none.clone(),
            2,
            "readable by others",
        ),
        (
            "a node update that changes nothing",
            admin(&["update", "node", "x"]),
            none.clone(),
            2,
            "say what to change",
        ),
        (
            "a class keeping no versions",
            admin(&["define", "mgmtclass", "standard", "c", "--versions-exist", "0"]),
            none.clone(),
            2,
            "0 is outside 1 to 4294967294 versions, or nolimit",
        ),
        (
            "a class keeping days that are none",
            admin(&["update", "mgmtclass", "standard", "c", "--retain-extra", "soon"]),
            none.clone(),
            2,
            "is not a number: give 0 to 4294967294 days, or nolimit",
        ),
        (
            "a container id that is none",
            admin(&["audit", "stgpool", "--container", "xyz"]),
            none.clone(),
            2,
            "not a container id in hex",
        ),
        (
            "a session number that is none",
            admin(&["cancel", "session", "first"]),
            none.clone(),
            2,
            "invalid digit",
        ),
        (
            "a catalog to migrate that is none",
            argv(&["admin", "migrate-catalog", "--from", &garbage_s, "--to", &s(&d.join("c.db"))]),
            none.clone(),
            2,
            "is not a QSM catalog",
        ),
        (
            "a catalog to migrate that does not exist",
            argv(&[
                "admin",
                "migrate-catalog",
                "--from",
                "/no/such.db",
                "--to",
                &s(&d.join("c.db")),
            ]),
            none.clone(),
            2,
            "does not exist",
        ),
        // compress, decompress, info, codecs
        (
            "compress with 100000 threads",
            argv(&["compress", "-T", "100000", "-o", &s(&d.join("t.qsm")), &s(&src.join("f"))]),
            none.clone(),
            0,
            "per core",
        ),
        (
            "a level out of range",
            argv(&[
                "compress",
                "--codec",
                "zstd",
                "--level",
                "99",
                "-o",
                &s(&d.join("l.qsm")),
                &s(&src.join("f")),
            ]),
            none.clone(),
            2,
            "--level 99",
        ),
        (
            "a quantum too small",
            argv(&["compress", "--quantum", "1K", "-o", &s(&d.join("q.qsm")), &s(&src.join("f"))]),
            none.clone(),
            2,
            "outside 4096 to 16777216 bytes",
        ),
        (
            "an input that does not exist",
            argv(&["compress", "/no/such/input", "-o", &s(&d.join("n.qsm"))]),
            none.clone(),
            2,
            "cannot open /no/such/input",
        ),
        (
            "an empty range of quanta",
            argv(&["decompress", "--quanta", "5..2", "-t", &stream]),
            none.clone(),
            2,
            "holds no quantum",
        ),
        (
            "a range that is not one",
            argv(&["decompress", "--quanta", "x..y", &stream]),
            none.clone(),
            2,
            "invalid range",
        ),
        (
            "a quantum past the last number",
            argv(&["decompress", "--quanta", "18446744073709551615", "-t", &stream]),
            none.clone(),
            2,
            "invalid range",
        ),
        (
            "decompress with no threads",
            argv(&["decompress", "-T", "0", "-t", &stream]),
            none.clone(),
            2,
            "at least 1",
        ),
        (
            "a stream that is none",
            argv(&["decompress", "-t", &garbage_s]),
            none.clone(),
            2,
            "not a QSM stream",
        ),
        (
            "a stream to describe that is none",
            argv(&["info", &garbage_s]),
            none.clone(),
            2,
            "not a QSM stream",
        ),
        (
            "a stream to describe that does not exist",
            argv(&["info", "/no/such.qsm"]),
            none.clone(),
            2,
            "cannot open /no/such.qsm",
        ),
        (
            "an option codecs does not have",
            argv(&["codecs", "--level", "3"]),
            none.clone(),
            2,
            "--level",
        ),
        // stand
        ("a plan that is none", argv(&["stand", "run", &garbage_s]), none.clone(), 2, "plan"),
        (
            "a plan that does not exist",
            argv(&["stand", "run", "/no/such/plan.toml"]),
            none.clone(),
            2,
            "reading the plan /no/such/plan.toml",
        ),
        (
            "a plan with a block of no bytes",
            argv(&["stand", "run", &zero_block]),
            none.clone(),
            2,
            "is not a block size",
        ),
        (
            "a plan of endless passes",
            argv(&["stand", "run", &endless]),
            none.clone(),
            2,
            "repetitions: 4000000000: at most 10000 timed passes",
        ),
        (
            "a quick run with no file for its CSV",
            argv(&["stand", "quick", "--csv"]),
            none.clone(),
            2,
            "--csv",
        ),
        (
            "reports that are none",
            argv(&["stand", "compare", &garbage_s, &garbage_s]),
            none.clone(),
            2,
            "not a qsm stand --json report",
        ),
        (
            "a negative threshold",
            argv(&["stand", "compare", "--threshold=-1", &garbage_s, &garbage_s]),
            none.clone(),
            2,
            "-1 is outside 0 to 10000 percent",
        ),
        (
            "a threshold that is no number",
            argv(&["stand", "compare", "--threshold", "NaN", &garbage_s, &garbage_s]),
            none.clone(),
            2,
            "outside 0 to 10000 percent",
        ),
        (
            "a load for no time",
            argv(&["stand", "load", "cpu:1", "--seconds=0"]),
            none.clone(),
            2,
            "0 is outside 0.001 to 31536000 seconds",
        ),
        (
            "a load for longer than a clock holds",
            argv(&["stand", "load", "cpu:1", "--seconds", "1e30"]),
            none.clone(),
            2,
            "outside 0.001 to 31536000 seconds",
        ),
        ("a load that is none", argv(&["stand", "load", "cpu:x"]), none.clone(), 2, "load cpu:x"),
        (
            "a report to plot that is none",
            argv(&["stand", "plot", &garbage_s, "--out", &s(&d.join("plots"))]),
            none.clone(),
            2,
            "not a qsm stand --json report",
        ),
        // key
        (
            "a key file that is none",
            argv(&["key", "show-fingerprint", "--key-file", &garbage_s]),
            passphrase.clone(),
            2,
            "not a QSM key file",
        ),
        (
            "a key file that does not exist",
            argv(&["key", "show-fingerprint", "--key-file", "/no/such/key"]),
            passphrase.clone(),
            2,
            "make one with `qsm key init`",
        ),
        (
            "a key file to rewrap that is none",
            argv(&["key", "change-passphrase", "--key-file", &garbage_s]),
            passphrase.clone(),
            2,
            "not a QSM key file",
        ),
        (
            "a key file to upload that is none",
            argv(&["key", "upload", "--key-file", &garbage_s]),
            passphrase.clone(),
            2,
            "not a QSM key file",
        ),
        (
            "a key to recover with a configuration that is none",
            argv(&["key", "recover", "--key-file", &s(&d.join("k2")), "--config", &garbage_s]),
            passphrase.clone(),
            2,
            "the client configuration",
        ),
        (
            "an empty passphrase file",
            argv(&["key", "init", "--key-file", &s(&d.join("k"))]),
            vec![("QSM_PASSPHRASE_FILE", empty_s.clone())],
            2,
            "is empty",
        ),
        (
            "a passphrase too short",
            argv(&["key", "init", "--key-file", &s(&d.join("k"))]),
            vec![("QSM_PASSPHRASE_FILE", s(&private(d, "short", "abc\n")))],
            2,
            "shorter than 8 bytes",
        ),
        // journal
        ("a journal of nothing", argv(&["journal", "start"]), none.clone(), 2, "<PATHS>"),
        (
            "a journal to start that is none",
            argv(&["journal", "--journal", &garbage_s, "start", &src_s]),
            none.clone(),
            2,
            "is not a QSM change journal",
        ),
        (
            "a journal to ask that is none",
            argv(&["journal", "--journal", &garbage_s, "status"]),
            none.clone(),
            2,
            "is not a QSM change journal",
        ),
        (
            "journal status with a pattern that is none",
            argv(&[
                "journal",
                "--journal",
                &s(&d.join("no-journal.db")),
                "status",
                "--include",
                "a[b",
            ]),
            none.clone(),
            2,
            "include pattern",
        ),
    ];
    for (what, args, env, code, fragment) in cases {
        let mut c = qsm();
        c.env("QSM_HOME", &home).env("HOME", d).args(&args);
        for k in [
            "QSM_SERVER",
            "QSM_NODE",
            "QSM_ADMIN",
            "QSM_PASSWORD_FILE",
            "QSM_CA",
            "QSM_CONFIG",
            "QSM_SERVER_CONFIG",
            "QSM_INSECURE",
            "QSM_KEY_FILE",
            "QSM_JOURNAL",
            "QSM_PASSPHRASE_FILE",
        ] {
            c.env_remove(k);
        }
        for (k, v) in &env {
            c.env(k, v);
        }
        let out = c
            .timeout(std::time::Duration::from_secs(120))
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked at"), "{what}: a panic: {stderr}");
        assert_eq!(out.status.code(), Some(code), "{what}: {stderr}");
        assert!(stderr.contains(fragment), "{what}: {fragment:?} not in: {stderr}");
        // Said once: no cause repeated after itself ("X: X").
        for line in stderr.lines().filter(|l| l.starts_with("qsm: error: ")) {
            let parts: Vec<&str> = line.split(": ").collect();
            assert!(parts.windows(2).all(|w| w[0] != w[1]), "{what}: a cause repeated: {line}");
        }
    }
}

/// Issue 31: `-T` far beyond the cores is capped, said in a warning, and the backup completes
/// as any other (a typo of many digits once spawned thousands of threads and ran out of
/// memory).
#[test]
fn threads_far_beyond_the_cores_are_capped_and_the_backup_completes() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap_or_else(|e| panic!("{e}"));
    let data = text(300_000);
    fs::write(src.join("a.txt"), &data).unwrap_or_else(|e| panic!("{e}"));
    fs::write(src.join("sub/b.txt"), b"small").unwrap_or_else(|e| panic!("{e}"));
    let run = |args: &[&str], extra: &[&Path]| {
        let out = qsm()
            .env("QSM_HOME", dir.path().join("home"))
            .env("HOME", dir.path())
            .env_remove("QSM_SERVER")
            .args(args)
            .args(extra)
            .timeout(std::time::Duration::from_secs(300))
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked at"), "{args:?}: a panic: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
    };
    let (stdout, stderr) = run(&["backup", "-T", "100000"], &[&src]);
    assert!(
        stderr.contains("--threads 100000 is more than 4 per core: using"),
        "no warning about the cap: {stderr}"
    );
    assert!(stdout.contains("failed 0"), "{stdout}");
    let out = dir.path().join("out");
    run(&["restore", "--to"], &[&out, &src]);
    assert_eq!(read(&out.join("a.txt")), data);
    assert_eq!(read(&out.join("sub/b.txt")), b"small");
}

/// Issue 31: a reader that closes stdout early (`qsm query backup DIR | head -1`) ends the
/// output quietly: no panic, no error, exit 0 (or death by SIGPIPE, 141 in a shell).
/// A closed stderr (`qsm ... 2>&1 | head` after head has gone) loses the messages, never
/// panics: a warning or an error to stderr ends the command with its own exit code.
#[test]
fn a_closed_stderr_never_panics() {
    use std::os::unix::process::ExitStatusExt;
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let runs: [(&str, Vec<&str>, i32); 2] = [
        ("an error", vec!["backup", "/nonexistent/qsm-test-path"], 1),
        ("a usage error", vec!["compress", "--level", "99", "/etc/hostname"], 2),
    ];
    for (what, args, code) in runs {
        // The read end is closed before the command starts: every write to stderr fails.
        let (reader, writer) = std::io::pipe().unwrap_or_else(|e| panic!("{e}"));
        drop(reader);
        let status = std::process::Command::new(assert_cmd::cargo::cargo_bin("qsm"))
            .env("QSM_HOME", dir.path().join("home"))
            .env("HOME", dir.path())
            .env_remove("QSM_SERVER")
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(writer)
            .status()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status.code(), Some(code), "{what}: {status:?} (101 is a panic)");
        assert!(status.signal().is_none(), "{what}: {status:?}");
    }
}

#[test]
fn a_closed_stdout_never_panics() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap_or_else(|e| panic!("{e}"));
    // More lines of listing than a pipe holds (64 KiB), so the writer is still writing.
    for i in 0..2000 {
        fs::write(src.join(format!("file-{i:05}")), i.to_string())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let home = dir.path().join("home");
    let env = |c: &mut std::process::Command| {
        c.env("QSM_HOME", &home).env("HOME", dir.path()).env_remove("QSM_SERVER");
    };
    qsm()
        .env("QSM_HOME", &home)
        .env("HOME", dir.path())
        .env_remove("QSM_SERVER")
        .arg("backup")
        .arg(&src)
        .assert()
        .success();
    // A data stream several megabytes long.
    let big = write(&dir, "big.txt", &text(8 << 20));
    let stream = dir.path().join("big.qsm");
    qsm().args(["compress", "-c", "none", "-o"]).arg(&stream).arg(&big).assert().success();
    let runs: [(&str, Vec<std::ffi::OsString>); 4] = [
        ("query backup", vec!["query".into(), "backup".into(), src.clone().into()]),
        ("query backup --json", vec!["query".into(), "backup".into(), "--json".into()]),
        ("info --quanta", vec!["info".into(), "--quanta".into(), stream.clone().into()]),
        ("decompress to stdout", vec!["decompress".into(), stream.clone().into()]),
    ];
    for (what, args) in runs {
        let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("qsm"));
        env(&mut c);
        let mut child = c
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut first = [0u8; 16];
        if let Some(mut out) = child.stdout.take() {
            out.read_exact(&mut first).unwrap_or_else(|e| panic!("{what}: {e}"));
            // Dropped: the read end is closed with most of the output unread.
        }
        let done = child.wait_with_output().unwrap_or_else(|e| panic!("{what}: {e}"));
        let stderr = String::from_utf8_lossy(&done.stderr);
        assert!(!stderr.contains("panicked at"), "{what}: a panic: {stderr}");
        assert!(
            done.status.code() == Some(0) || done.status.signal() == Some(13),
            "{what}: {} {stderr}",
            done.status
        );
        assert!(!stderr.contains("error"), "{what}: {stderr}");
    }
}
