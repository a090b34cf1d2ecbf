//! The ratio penalty of independent quanta: how much larger a stream of separately compressed
//! quanta is than the same codec, at the same level, compressing the whole file in one block.
//!
//! ```text
//! cargo run --release -p qsm-codec --example quantum_ratio -- [DIR]    (default /tmp/corpus)
//! ```
//!
//! For every regular, non-empty file directly in DIR (not recursive), every setting of
//! [`SETTINGS`] and every quantum size of [`QUANTA`]:
//!
//! - `whole` = bytes the codec's own compressor writes for the whole file in one call: no frame
//!   header, no raw fallback (what `zstd -3`, `lz4` or `zlib` alone would store, minus their
//!   container headers);
//! - `stream` = the sum over the file's quanta of [`FrameHeader::frame_len`]: 28 header bytes
//!   plus the payload, which is the raw quantum when compressing it saves under 1/32, exactly
//!   as `qsm compress` frames it;
//! - **ratio penalty = stream / whole − 1**, in percent (negative when framing wins, e.g. on
//!   incompressible data that the frame stores raw while the codec expands it).
//!
//! One Markdown table per setting goes to stdout, progress to stderr. Files are shared out to
//! one worker per core.
//!
//! [`FrameHeader::frame_len`]: qsm_codec::FrameHeader::frame_len

use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Instant;

use qsm_codec::{Compression, FrameEncoder};

/// Errors cross worker threads, hence `Send + Sync`.
type BoxError = Box<dyn Error + Send + Sync>;
type Result<T> = std::result::Result<T, BoxError>;

/// The codec settings compared, in `qsm compress -c` syntax.
const SETTINGS: [&str; 4] = ["zstd:3", "zstd:1", "lz4", "zlib:6"];

/// Quantum sizes, from the smallest the engine accepts (4 KiB) to 4 MiB.
const QUANTA: [usize; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];

/// The directory read when none is given.
const DEFAULT_DIR: &str = "/tmp/corpus";

/// One file of the corpus.
#[derive(Debug)]
struct Input {
    name: String,
    path: PathBuf,
    len: u64,
}

/// The compressed sizes of one file under one setting.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// The codec on the whole file in one block.
    whole: u64,
    /// The framed quanta, for each entry of [`QUANTA`].
    stream: [u64; QUANTA.len()],
}

impl Sizes {
    /// Penalty in percent of quantum size number `q`.
    fn penalty(&self, q: usize) -> f64 {
        penalty(self.stream[q], self.whole)
    }
}

fn penalty(stream: u64, whole: u64) -> f64 {
    (stream as f64 / whole.max(1) as f64 - 1.0) * 100.0
}

fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let dir = args.next().map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from);
    if args.next().is_some() {
        return Err("usage: quantum_ratio [DIR]".into());
    }
    let settings =
        SETTINGS.into_iter().map(Compression::parse).collect::<std::result::Result<Vec<_>, _>>()?;
    let files = list_files(&dir)?;
    if files.is_empty() {
        return Err(format!("no non-empty regular files in {}", dir.display()).into());
    }

    // Jobs are (file, setting) pairs, largest files first so that the last job to finish is a
    // small one and no core idles while another works through the biggest file.
    let mut jobs: Vec<(usize, usize)> =
        (0..files.len()).flat_map(|f| (0..settings.len()).map(move |s| (f, s))).collect();
    jobs.sort_by_key(|&(f, _)| std::cmp::Reverse(files[f].len));

    let threads = thread::available_parallelism().map_or(1, usize::from).min(jobs.len());
    let total_mb = files.iter().map(|f| f.len).sum::<u64>() as f64 / 1e6;
    let file_count = files.len();
    eprintln!(
        "quantum_ratio: {file_count} files, {total_mb:.1} MB, {} settings, {} quantum sizes, {threads} threads",
        settings.len(),
        QUANTA.len()
    );
    let start = Instant::now();
    let results = run_jobs(&files, &settings, &jobs, threads)?;
    eprintln!("quantum_ratio: done in {:.1} s", start.elapsed().as_secs_f64());

    println!("## Ratio penalty of independent quanta\n");
    println!(
        "Penalty = size of the stream of independently framed quanta (payload + {} header bytes \
         per quantum; a quantum that saves under 1/32 is stored raw) / size of the same codec \
         and level on the whole file in one block − 1. The stream's index (16 bytes per \
         quantum) and its fixed 56 bytes of header and trailer are not counted. Corpus: {} \
         ({file_count} files, {total_mb:.1} MB).\n",
        qsm_codec::frame::FRAME_HEADER_LEN,
        dir.display()
    );
    for (s, setting) in settings.iter().enumerate() {
        let sizes: Vec<Sizes> = (0..files.len()).map(|f| results[f][s]).collect();
        print_table(&setting.to_string(), &files, &sizes);
    }
    Ok(())
}

/// The regular, non-empty files directly in `dir`, sorted by name. Hidden files are skipped.
fn list_files(dir: &Path) -> Result<Vec<Input>> {
    let mut files = Vec::new();
    let entries = fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        // `fs::metadata` follows symbolic links, so a link to a file counts as that file.
        let meta =
            fs::metadata(&path).map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
        if name.starts_with('.') || !meta.is_file() || meta.len() == 0 {
            continue;
        }
        files.push(Input { name, path, len: meta.len() });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// Runs every job on `threads` workers and returns the sizes indexed by `[file][setting]`.
fn run_jobs(
    files: &[Input],
    settings: &[Compression],
    jobs: &[(usize, usize)],
    threads: usize,
) -> Result<Vec<Vec<Sizes>>> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let worker = || -> Result<Vec<(usize, usize, Sizes)>> {
        let mut done = Vec::new();
        while !failed.load(Ordering::Relaxed) {
            let Some(&(f, s)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) else { break };
            let file = &files[f];
            let sizes = fs::read(&file.path)
                .map_err(|e| BoxError::from(format!("cannot read {}: {e}", file.path.display())))
                .and_then(|data| measure(&data, settings[s]))
                .map_err(|e| {
                    failed.store(true, Ordering::Relaxed);
                    format!("{} with {}: {e}", file.name, settings[s])
                })?;
            // `Compression`'s Display ignores widths: pad its string instead.
            let label = settings[s].to_string();
            eprintln!(
                "  {:<16} {label:<8} {:>7.3}:1 whole",
                file.name,
                ratio(file.len, sizes.whole)
            );
            done.push((f, s, sizes));
        }
        Ok(done)
    };

    let outcomes: Vec<Result<Vec<(usize, usize, Sizes)>>> = thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(worker)).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker thread panicked".into())))
            .collect()
    });

    let mut results: Vec<Vec<Option<Sizes>>> = vec![vec![None; settings.len()]; files.len()];
    for outcome in outcomes {
        for (f, s, sizes) in outcome? {
            results[f][s] = Some(sizes);
        }
    }
    results
        .into_iter()
        .map(|row| row.into_iter().collect::<Option<Vec<Sizes>>>())
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| "internal error: a job produced no result".into())
}

/// Compresses `data` whole and in quanta of every size of [`QUANTA`].
fn measure(data: &[u8], setting: Compression) -> Result<Sizes> {
    // The whole file goes to the codec directly, not through a FrameEncoder: frames refuse
    // more than MAX_QUANTUM (16 MiB) and the Silesia files nci and samba are larger.
    let codec = setting.codec;
    let mut compressor = codec.compressor(setting.level)?;
    let mut buf = vec![0u8; codec.max_compressed_len(data.len())];
    let whole = compressor.compress(data, &mut buf)? as u64;
    drop(buf);

    // One encoder reused for every quantum, as one engine worker would be.
    let mut encoder = FrameEncoder::new(setting)?;
    let mut frame = Vec::new();
    let mut stream = [0u64; QUANTA.len()];
    for (total, &size) in stream.iter_mut().zip(QUANTA.iter()) {
        for quantum in data.chunks(size) {
            *total += encoder.encode(quantum, &mut frame)?.frame_len() as u64;
        }
    }
    Ok(Sizes { whole, stream })
}

fn ratio(raw: u64, compressed: u64) -> f64 {
    raw as f64 / compressed.max(1) as f64
}

/// `4K`, `1M`: quantum sizes as `qsm compress -q` takes them.
fn size_label(n: usize) -> String {
    if n >= 1 << 20 { format!("{}M", n >> 20) } else { format!("{}K", n >> 10) }
}

/// A file length for people: bytes, KiB or MiB.
fn human(n: u64) -> String {
    let n_f = n as f64;
    if n >= 1 << 20 {
        format!("{:.1} MiB", n_f / f64::from(1u32 << 20))
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n_f / 1024.0)
    } else {
        format!("{n} B")
    }
}

fn print_table(setting: &str, files: &[Input], sizes: &[Sizes]) {
    println!("### {setting}\n");
    let header: Vec<String> = QUANTA.iter().map(|&q| size_label(q)).collect();
    println!("| file | size | whole-file ratio | {} |", header.join(" | "));
    println!("|---|---:|---:|{}", "---:|".repeat(QUANTA.len()));
    for (file, s) in files.iter().zip(sizes) {
        let cells: Vec<String> =
            (0..QUANTA.len()).map(|q| format!("{:+.2}%", s.penalty(q))).collect();
        println!(
            "| {} | {} | {:.3} | {} |",
            file.name,
            human(file.len),
            ratio(file.len, s.whole),
            cells.join(" | ")
        );
    }

    let count = sizes.len() as f64;
    let mean: Vec<String> = (0..QUANTA.len())
        .map(|q| format!("{:+.2}%", sizes.iter().map(|s| s.penalty(q)).sum::<f64>() / count))
        .collect();
    println!("| **average** (mean of files) | | | {} |", mean.join(" | "));

    let worst: Vec<String> = (0..QUANTA.len())
        .map(|q| {
            let (file, s) = files
                .iter()
                .zip(sizes)
                .max_by(|a, b| a.1.penalty(q).total_cmp(&b.1.penalty(q)))
                .map_or(("-", 0.0), |(f, s)| (f.name.as_str(), s.penalty(q)));
            format!("{s:+.2}% ({file})")
        })
        .collect();
    println!("| **worst** | | | {} |", worst.join(" | "));

    // Byte-weighted: the penalty of all files taken as one data set, dominated by the big ones.
    let raw: u64 = files.iter().map(|f| f.len).sum();
    let whole: u64 = sizes.iter().map(|s| s.whole).sum();
    let all: Vec<String> = (0..QUANTA.len())
        .map(|q| format!("{:+.2}%", penalty(sizes.iter().map(|s| s.stream[q]).sum(), whole)))
        .collect();
    println!(
        "| **all bytes** (sum of files) | {} | {:.3} | {} |\n",
        human(raw),
        ratio(raw, whole),
        all.join(" | ")
    );
}
