//! The plugin ABI end to end: the sample C plugin (`plugin/sample.c`) is compiled here, loaded
//! through a plan and measured; a broken build of it gets no time; libraries that do not
//! speak the ABI are refused by name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use qsm_stand::Plan;
use qsm_stand::measure::MeasureError;

fn compile(dir: &Path, name: &str, source: &Path, defines: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror"])
        .args(defines)
        .arg("-o")
        .arg(&out)
        .arg(source)
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e} (a C compiler is needed, as for zstd)"));
    assert!(status.success(), "{cc} failed on {}", source.display());
    out
}

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("plugin/sample.c")
}

fn plan(dir: &Path, algorithms: &str) -> Result<Plan, qsm_stand::PlanError> {
    let text = format!(
        "algorithms = [{algorithms}]\nblock_sizes = [\"4K\", \"16K\"]\npatterns = [\"zeros\", \"random\"]\nbytes_per_cell = \"128K\"\nwarmup = 0\nrepetitions = 2\nmemory_node = 0\n"
    );
    let path = dir.join("plan.toml");
    Plan::parse(&text, &path.to_string_lossy())
}

#[test]
fn a_c_plugin_is_measured_through_the_abi() {
    let dir = tempfile::tempdir().unwrap();
    compile(dir.path(), "libsample.so", &sample(), &[]);
    let plan = plan(dir.path(), "\"plugin:libsample.so\", \"lz4\"").unwrap();
    let report = qsm_stand::run(&plan, &mut |_| {}).unwrap();
    let plugin: Vec<_> =
        report.cells.iter().filter(|c| c.algorithm == "plugin:libsample.so").collect();
    assert_eq!(plugin.len(), 8, "2 operations x 2 block sizes x 2 patterns");
    for c in &plugin {
        // One sample per reading: a batch of blocks when they are too fast to time alone.
        let blocks = 128 * 1024 / c.block_size;
        assert_eq!(c.stats.samples, 2 * (blocks / c.blocks_per_reading), "{c:?}");
        assert!(c.stats.min_ns > 0 && c.mb_per_s > 0.0, "{c:?}");
        let ratio = c.ratio.unwrap();
        match c.pattern.as_str() {
            // PackBits stores 128 equal bytes in 2.
            "zeros" => assert!((ratio - 64.0).abs() < 1.0, "{ratio}"),
            // and 128 literals in 129.
            _ => assert!(ratio < 1.0 && ratio > 0.99, "{ratio}"),
        }
    }
}

#[test]
fn a_broken_plugin_gets_no_time() {
    let dir = tempfile::tempdir().unwrap();
    compile(dir.path(), "libsample.so", &sample(), &["-DSAMPLE_BROKEN"]);
    let plan = plan(dir.path(), "\"plugin:libsample.so\"").unwrap();
    let mut measured = 0;
    let e = qsm_stand::run(&plan, &mut |_| measured += 1).unwrap_err();
    assert!(matches!(e, MeasureError::Verify { block: 0, .. }), "{e}");
    assert!(e.to_string().contains("plugin:libsample.so compress"), "{e}");
    assert_eq!(measured, 0);
}

#[test]
fn libraries_that_do_not_speak_the_abi_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let src = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    let other = src("other.c", "int other(void) { return 0; }\n");
    compile(dir.path(), "libother.so", &other, &[]);
    let future =
        src("future.c", "#include <stdint.h>\nuint32_t qsm_stand_abi(void) { return 2; }\n");
    compile(dir.path(), "libfuture.so", &future, &[]);
    let half = src("half.c", "#include <stdint.h>\nuint32_t qsm_stand_abi(void) { return 1; }\n");
    compile(dir.path(), "libhalf.so", &half, &[]);
    std::fs::write(dir.path().join("libtext.so"), "not a library").unwrap();
    let cases = [
        ("libother.so", "not a qsm stand plugin"),
        ("libfuture.so", "ABI version 2, this qsm stand speaks 1"),
        ("libhalf.so", "qsm_stand_encode"),
        ("libtext.so", "libtext.so"),
        ("libnone.so", "libnone.so: no such file"),
    ];
    for (lib, expected) in cases {
        let e = plan(dir.path(), &format!("\"plugin:{lib}\"")).unwrap_err().to_string();
        assert!(e.contains("algorithms[0]") && e.contains(expected), "{lib}: {e}");
    }
}
