//! Chooses FastCDC's sizes by measurement (`bench/cdc.sh` runs it):
//!
//! ```sh
//! cargo run --release -p qsm-client --example cdc_sizes -- CORPUS_DIR [SMALL_FILE_TREE]
//! ```
//!
//! For each average size (minimum a quarter, maximum four times): chunking speed; chunks and
//! catalog rows per GiB; the share of an edited copy of the corpus (one random insertion,
//! deletion or overwrite of 1–64 bytes per MiB) found among the original's chunks; and the
//! zstd -3 ratio of the chunks compressed one by one, as the pipeline compresses them. For the
//! small-file tree: how many files and bytes sit below each minimum (those files are one
//! chunk whatever the sizes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use qsm_client::chunker::{ChunkSizes, chunks};

fn read(path: &Path) -> Vec<u8> {
    if path.extension().is_some_and(|e| e == "xz") {
        let out = Command::new("xz").arg("-dc").arg(path).output().expect("running xz");
        assert!(out.status.success(), "xz -dc {}", path.display());
        out.stdout
    } else {
        std::fs::read(path).unwrap()
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One edit per MiB on average, at random places: insert, delete or overwrite 1–64 bytes.
fn edited(data: &[u8], rng: &mut Rng) -> Vec<u8> {
    let edits = (data.len() >> 20).max(1);
    let mut places: Vec<usize> =
        (0..edits).map(|_| rng.next() as usize % data.len().max(1)).collect();
    places.sort_unstable();
    let mut out = Vec::with_capacity(data.len() + 64 * edits);
    let mut at = 0;
    for p in places {
        if p < at {
            continue;
        }
        out.extend_from_slice(&data[at..p]);
        let n = 1 + rng.next() as usize % 64;
        match rng.next() % 3 {
            0 => {
                out.extend((0..n).map(|_| rng.next() as u8));
                at = p;
            }
            1 => at = (p + n).min(data.len()),
            _ => {
                out.extend((0..n).map(|_| rng.next() as u8));
                at = (p + n).min(data.len());
            }
        }
    }
    out.extend_from_slice(&data[at..]);
    out
}

fn walk(dir: &Path, sizes: &mut Vec<u64>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let Ok(m) = e.path().symlink_metadata() else { continue };
        if m.is_dir() {
            walk(&e.path(), sizes);
        } else if m.is_file() {
            sizes.push(m.len());
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let corpus = PathBuf::from(args.next().expect("usage: cdc_sizes CORPUS_DIR [SMALL_FILE_TREE]"));
    let tree = args.next().map(PathBuf::from);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_none_or(|e| e != "md"))
        .collect();
    files.sort();
    let originals: Vec<Vec<u8>> = files.iter().map(|p| read(p)).collect();
    let mut rng = Rng(0x5153_4d36);
    let copies: Vec<Vec<u8>> = originals.iter().map(|d| edited(d, &mut rng)).collect();
    let total: usize = originals.iter().map(Vec::len).sum();
    let gib = total as f64 / f64::from(1u32 << 30);
    println!(
        "{} files, {:.1} MB; the edited copy has {} edits\n",
        files.len(),
        total as f64 / 1e6,
        originals.iter().map(|d| (d.len() >> 20).max(1)).sum::<usize>()
    );
    println!(
        "| min / avg / max | chunking MB/s | chunks | chunks per GiB | edited copy found | zstd -3 ratio, chunk by chunk |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let mut z = zstd::bulk::Compressor::new(3).unwrap();
    for avg_kib in [16, 32, 64, 128, 256, 512, 1024] {
        let sizes = ChunkSizes::around(avg_kib << 10).validate().unwrap();
        let t = Instant::now();
        let mut n = 0usize;
        let mut seen: HashSet<[u8; 32]> = HashSet::new();
        let mut packed = 0usize;
        for d in &originals {
            for r in chunks(d, sizes, 1) {
                n += 1;
                seen.insert(*blake3::hash(&d[r]).as_bytes());
            }
        }
        let secs = t.elapsed().as_secs_f64();
        for d in &originals {
            for r in chunks(d, sizes, 1) {
                packed += z.compress(&d[r]).unwrap().len();
            }
        }
        let (mut found, mut all) = (0usize, 0usize);
        for d in &copies {
            for r in chunks(d, sizes, 1) {
                all += r.len();
                if seen.contains(blake3::hash(&d[r.clone()]).as_bytes()) {
                    found += r.len();
                }
            }
        }
        println!(
            "| {}K / {}K / {}K | {:.0} | {} | {:.0} | {:.1}% | {:.3} |",
            sizes.min >> 10,
            sizes.avg >> 10,
            sizes.max >> 10,
            total as f64 / secs / 1e6,
            n,
            n as f64 / gib,
            found as f64 / all as f64 * 100.0,
            total as f64 / packed as f64
        );
    }
    if let Some(tree) = tree {
        let mut sizes = Vec::new();
        walk(&tree, &mut sizes);
        let (count, bytes) = (sizes.len(), sizes.iter().sum::<u64>());
        println!("\n{}: {count} files, {:.1} MB\n", tree.display(), bytes as f64 / 1e6);
        println!("| minimum | files below it (one chunk each) | their bytes |");
        println!("|---:|---:|---:|");
        for min_kib in [4u64, 8, 16, 32, 64, 128, 256] {
            let below: Vec<&u64> = sizes.iter().filter(|&&s| s < min_kib << 10).collect();
            println!(
                "| {min_kib}K | {:.1}% | {:.1}% |",
                below.len() as f64 / count.max(1) as f64 * 100.0,
                below.iter().copied().sum::<u64>() as f64 / bytes.max(1) as f64 * 100.0
            );
        }
    }
}
