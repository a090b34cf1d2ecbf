//! The crate layering of docs/ARCHITECTURE.md, held against `cargo metadata`: a crate that
//! starts using one it may not fails this test, naming the rule it breaks.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Who may use whom (normal and build dependencies; tests may use more). Arrows point down
/// only: the CLI at the top, the vocabulary and the codecs at the bottom.
const MAY_USE: &[(&str, &[&str])] = &[
    ("qsm-types", &[]),
    // Tests only: a FUSE file system that forgets what was not synced.
    ("qsm-powercut", &[]),
    ("qsm-codec", &[]),
    ("qsm-crypt", &["qsm-codec"]),
    ("qsm-stand", &["qsm-codec"]),
    ("qsm-proto", &["qsm-types"]),
    ("qsm-catalog", &["qsm-types"]),
    ("qsm-pool", &["qsm-codec"]),
    ("qsm-pool-s3", &["qsm-pool", "qsm-codec"]),
    ("qsm-store", &["qsm-catalog", "qsm-pool", "qsm-codec", "qsm-types"]),
    ("qsm-client", &["qsm-codec", "qsm-crypt", "qsm-proto", "qsm-types"]),
    (
        "qsm-server",
        &[
            "qsm-store",
            "qsm-catalog",
            "qsm-pool",
            "qsm-pool-s3",
            "qsm-codec",
            "qsm-crypt",
            "qsm-proto",
            "qsm-types",
        ],
    ),
    (
        "qsm",
        &[
            "qsm-client",
            "qsm-server",
            "qsm-stand",
            "qsm-codec",
            "qsm-crypt",
            "qsm-proto",
            "qsm-types",
            // `qsm admin migrate-catalog` copies one catalog into another, by themselves,
            // with no server running (`qsm_catalog::copy::migrate`).
            "qsm-catalog",
        ],
    ),
];

/// Arrows that must never exist, and why: the reasons are the design's.
const NEVER: &[(&str, &str, &str)] = &[
    ("qsm-codec", "qsm-catalog", "codecs know no database"),
    ("qsm-codec", "qsm-pool", "codecs know no storage"),
    ("qsm-codec", "qsm-proto", "codecs know no network"),
    ("qsm-client", "qsm-server", "the client reaches a server only through its interface"),
    ("qsm-client", "qsm-catalog", "the client never opens the catalog"),
    ("qsm-client", "qsm-pool", "the client never opens the pool"),
    ("qsm-client", "qsm-store", "the client never commits to storage itself"),
    ("qsm-proto", "qsm-catalog", "the protocol converts to shared types, not db rows"),
    ("qsm-stand", "qsm-catalog", "the benchmark measures algorithms only"),
    ("qsm-catalog", "qsm-pool", "catalog and pool meet only in the commit protocol"),
];

/// Each workspace crate's workspace dependencies (normal and build), from `cargo metadata`.
fn workspace_graph() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline", "--manifest-path"])
        .arg(manifest)
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = meta["packages"].as_array().expect("a package list");
    let members: BTreeSet<String> =
        packages.iter().filter_map(|p| p["name"].as_str().map(String::from)).collect();
    let mut graph = BTreeMap::new();
    for p in packages {
        let name = p["name"].as_str().expect("a package name").to_owned();
        let deps = p["dependencies"]
            .as_array()
            .expect("a dependency list")
            .iter()
            .filter(|d| d["kind"].is_null() || d["kind"] == "build")
            .filter_map(|d| d["name"].as_str())
            .filter(|d| members.contains(*d))
            .map(String::from)
            .collect();
        graph.insert(name, deps);
    }
    graph
}

/// What in `graph` breaks the rules, one line each.
fn violations(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = MAY_USE.iter().copied().collect();
    let mut broken = Vec::new();
    for (krate, deps) in graph {
        let Some(may) = allowed.get(krate.as_str()) else {
            broken.push(format!("{krate} is not in the layering: add it to MAY_USE"));
            continue;
        };
        for dep in deps {
            if let Some((_, _, why)) = NEVER.iter().find(|(a, b, _)| a == krate && b == dep) {
                broken.push(format!("{krate} uses {dep}: never ({why})"));
            } else if !may.contains(&dep.as_str()) {
                broken.push(format!("{krate} uses {dep}, which its layer may not use"));
            }
        }
    }
    broken
}

#[test]
fn every_crate_uses_only_the_crates_below_it() {
    let graph = workspace_graph();
    let broken = violations(&graph);
    assert!(broken.is_empty(), "layering broken:\n  {}", broken.join("\n  "));
    // The rules name real crates: a renamed crate must not make them pass by default.
    for (a, b, _) in NEVER {
        assert!(graph.contains_key(*a) && graph.contains_key(*b), "{a} or {b} is gone");
    }
    // No allowed arrow contradicts a never-arrow.
    let allowed: BTreeMap<&str, &[&str]> = MAY_USE.iter().copied().collect();
    for (a, b, why) in NEVER {
        assert!(!allowed[a].contains(b), "MAY_USE lets {a} use {b}, which is never: {why}");
    }
}

#[test]
fn a_forbidden_or_upward_arrow_is_caught() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> =
            MAY_USE.iter().map(|(k, _)| (k.to_string(), BTreeSet::new())).collect();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
        }
        g
    };
    assert!(violations(&graph(&[("qsm-client", "qsm-proto"), ("qsm", "qsm-server")])).is_empty());
    let never = violations(&graph(&[("qsm-client", "qsm-store")]));
    assert_eq!(
        never,
        ["qsm-client uses qsm-store: never (the client never commits to storage itself)"]
    );
    let upward = violations(&graph(&[("qsm-catalog", "qsm-server")]));
    assert_eq!(upward, ["qsm-catalog uses qsm-server, which its layer may not use"]);
    let unknown = violations(&graph(&[("qsm-new", "qsm-types")]));
    assert_eq!(unknown, ["qsm-new is not in the layering: add it to MAY_USE"]);
}
