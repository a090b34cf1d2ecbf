//! Records the versions of the crates whose code `qsm stand` measures, read from the
//! workspace's Cargo.lock, so every report says which implementation it timed.

use std::fmt::Write;

/// The crates behind the algorithms (codecs, ciphers, hashes).
const MEASURED: &[&str] = &[
    "zstd",
    "zstd-sys",
    "lz4_flex",
    "flate2",
    "zlib-rs",
    "weezl",
    "lzokay-native",
    "lzo",
    "quicklz",
    "aws-lc-rs",
    "aws-lc-sys",
    "blake3",
    "crc32c",
    "xxhash-rust",
];

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let lock = std::path::Path::new(&manifest).join("../../Cargo.lock");
    println!("cargo::rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(&lock).unwrap_or_default();
    let mut found: Vec<(String, String)> = Vec::new();
    // Cargo.lock lists `name = "..."` then `version = "..."` in each [[package]].
    let mut name: Option<String> = None;
    for line in text.lines() {
        let value =
            |l: &str, key: &str| l.strip_prefix(key).map(|v| v.trim().trim_matches('"').to_owned());
        if let Some(n) = value(line, "name = ") {
            name = Some(n);
        } else if let (Some(v), Some(n)) = (value(line, "version = "), name.take())
            && MEASURED.contains(&n.as_str())
        {
            found.push((n, v));
        }
    }
    found.sort();
    found.dedup();
    let mut out = String::from("/// (crate, version) of the measured implementations.\n");
    out.push_str("pub const CRATES: &[(&str, &str)] = &[\n");
    for (n, v) in &found {
        let _ = writeln!(out, "    ({n:?}, {v:?}),");
    }
    out.push_str("];\n");
    let dir = std::env::var("OUT_DIR").unwrap_or_default();
    if let Err(e) = std::fs::write(std::path::Path::new(&dir).join("crates.rs"), out) {
        println!("cargo::warning=cannot write the crate versions: {e}");
    }
}
