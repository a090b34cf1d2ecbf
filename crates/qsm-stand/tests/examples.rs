//! The example plans in `examples/stand/` stay valid.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

#[test]
fn every_example_plan_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/stand");
    let corpus = dir.join("../../../shared/corpus");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            match qsm_stand::Plan::parse(&text, &path.to_string_lossy()) {
                Ok(_) => {}
                // A checkout without the shared corpus beside it: the plan must say which
                // path it lacks.
                Err(e) if !corpus.is_dir() && text.contains("shared/corpus") => {
                    assert!(e.to_string().contains("shared/corpus"), "{}: {e}", path.display());
                }
                Err(e) => panic!("{}: {e}", path.display()),
            }
            n += 1;
        }
    }
    assert!(n >= 4, "example plans found: {n}");
}
