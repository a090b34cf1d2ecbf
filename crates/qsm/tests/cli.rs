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
    assert_eq!(report["cells"][0]["stats"]["samples"], 32, "16 blocks x 2 passes");
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

/// Issue 31: bad option values and bad files, command by command: the documented exit code
/// (2 for bad usage, 0 when a value is only capped), a message naming what was wrong, and
/// never a panic.
#[test]
fn bad_values_and_bad_files_exit_2_naming_them() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let d = dir.path();
    let src = d.join("src");
    fs::create_dir_all(&src).unwrap_or_else(|e| panic!("{e}"));
    fs::write(src.join("f"), "some data\n".repeat(1000)).unwrap_or_else(|e| panic!("{e}"));
    let private = |name: &str, text: &str| {
        let p = d.join(name);
        fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{e}"));
        p
    };
    let empty = private("empty", "");
    let garbage = private("garbage", "this is not a certificate, a key or a password file\n");
    let pw = private("pw", "a-password\n");
    // A stream to decompress.
    qsm().args(["compress", "-o"]).arg(d.join("s.qsm")).arg(src.join("f")).assert().success();
    let home = d.join("home");
    let s = |p: &std::path::Path| p.to_str().unwrap_or_default().to_owned();
    let remote = |server: &str, password: &std::path::Path, ca: Option<&std::path::Path>| {
        let mut env = vec![
            ("QSM_SERVER", server.to_owned()),
            ("QSM_NODE", "n".to_owned()),
            ("QSM_PASSWORD_FILE", s(password)),
        ];
        if let Some(ca) = ca {
            env.push(("QSM_CA", s(ca)));
        }
        env
    };
    let none: Vec<(&str, String)> = Vec::new();
    // (what, arguments, environment, exit code, fragment of stderr)
    let cases: Vec<Case> = vec![
        (
            "threads far beyond the cores",
            vec!["backup".into(), "-T".into(), "18446744073709551615".into(), s(&src)],
            none.clone(),
            0,
            "per core",
        ),
        (
            "compress with 100000 threads",
            vec![
                "compress".into(),
                "-T".into(),
                "100000".into(),
                "-o".into(),
                s(&d.join("t.qsm")),
                s(&src.join("f")),
            ],
            none.clone(),
            0,
            "per core",
        ),
        (
            "no threads",
            vec!["backup".into(), "-T".into(), "0".into(), s(&src)],
            none.clone(),
            2,
            "at least 1",
        ),
        (
            "an unknown compression",
            vec!["backup".into(), "--compression".into(), "zip:99".into(), s(&src)],
            none.clone(),
            2,
            "--compression",
        ),
        (
            "a level out of range",
            vec![
                "compress".into(),
                "--codec".into(),
                "zstd".into(),
                "--level".into(),
                "99".into(),
                "-o".into(),
                s(&d.join("l.qsm")),
                s(&src.join("f")),
            ],
            none.clone(),
            2,
            "--level 99",
        ),
        (
            "a quantum too small",
            vec![
                "compress".into(),
                "--quantum".into(),
                "1K".into(),
                "-o".into(),
                s(&d.join("q.qsm")),
                s(&src.join("f")),
            ],
            none.clone(),
            2,
            "outside 4096 to 16777216 bytes",
        ),
        (
            "a rate without a unit it knows",
            vec!["backup".into(), "--limit-upload".into(), "10 parsecs".into(), s(&src)],
            none.clone(),
            2,
            "unknown unit",
        ),
        (
            "an empty range of quanta",
            vec![
                "decompress".into(),
                "--quanta".into(),
                "5..2".into(),
                "-t".into(),
                s(&d.join("s.qsm")),
            ],
            none.clone(),
            2,
            "holds no quantum",
        ),
        (
            "a range that is not one",
            vec!["decompress".into(), "--quanta".into(), "x..y".into(), s(&d.join("s.qsm"))],
            none.clone(),
            2,
            "invalid range",
        ),
        (
            "an empty password file",
            vec!["query".into(), "filespace".into()],
            remote("http://127.0.0.1:9", &empty, None),
            2,
            "is empty",
        ),
        (
            "a missing password file",
            vec!["query".into(), "filespace".into()],
            remote("http://127.0.0.1:9", &d.join("nope"), None),
            2,
            "nope",
        ),
        (
            "a CA that is no certificate",
            vec!["query".into(), "filespace".into()],
            remote("https://127.0.0.1:9", &pw, Some(&garbage)),
            2,
            "no PEM certificate",
        ),
        (
            "a key file that is none",
            vec!["key".into(), "show-fingerprint".into(), "--key-file".into(), s(&garbage)],
            vec![("QSM_PASSPHRASE_FILE", s(&pw))],
            2,
            "not a QSM key file",
        ),
        (
            "an empty passphrase file",
            vec!["key".into(), "init".into(), "--key-file".into(), s(&d.join("k"))],
            vec![("QSM_PASSPHRASE_FILE", s(&empty))],
            2,
            "is empty",
        ),
    ];
    for (what, args, env, code, fragment) in cases {
        let mut c = qsm();
        c.env("QSM_HOME", &home).env("HOME", d).env_remove("QSM_SERVER").args(&args);
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
    }
}
