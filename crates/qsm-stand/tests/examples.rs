//! The example plans in `examples/stand/` stay valid.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

#[test]
fn every_example_plan_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/stand");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            if let Err(e) = qsm_stand::Plan::parse(&text, &path.to_string_lossy()) {
                panic!("{}: {e}", path.display());
            }
            n += 1;
        }
    }
    assert!(n >= 2, "example plans found: {n}");
}
