//! `qsm compress`, `qsm decompress`, `qsm info` and `qsm codecs`.

use std::fs::File;
use std::io::{self, BufReader, IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qsm_codec::{CompressOptions, Compression, StreamIndex, registry};
use serde::Serialize;

use crate::output::Output;
use crate::render::{Text, emit};

#[derive(Debug, Args)]
pub struct CompressArgs {
    /// Input file (stdin when absent or "-").
    input: Option<PathBuf>,
    /// Output file (stdout when absent).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Codec: auto, none, lz4, zstd, zlib, gzip, lzw, optionally with ":LEVEL" (e.g. zstd:3).
    #[arg(short, long, default_value = "auto")]
    codec: String,
    /// Level, overriding any given with the codec.
    #[arg(short, long, allow_hyphen_values = true)]
    level: Option<i32>,
    /// Quantum size in bytes, or with a K/M suffix (default 1M).
    #[arg(short, long, value_parser = parse_size)]
    quantum: Option<usize>,
    /// Worker threads (default: one per core).
    #[arg(short = 'T', long)]
    threads: Option<usize>,
    /// Overwrite the output file if it exists.
    #[arg(short, long)]
    force: bool,
    /// Print nothing but errors.
    #[arg(long)]
    quiet: bool,
}

#[derive(Debug, Args)]
pub struct DecompressArgs {
    /// Input stream (stdin when absent or "-").
    input: Option<PathBuf>,
    /// Output file (stdout when absent).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Decode only these quanta, e.g. 3..7 (needs a seekable input file).
    #[arg(long, value_parser = parse_range)]
    quanta: Option<std::ops::Range<u64>>,
    /// Verify every quantum and write nothing.
    #[arg(short = 't', long)]
    test: bool,
    /// Worker threads (default: one per core).
    #[arg(short = 'T', long)]
    threads: Option<usize>,
    /// Overwrite the output file if it exists.
    #[arg(short, long)]
    force: bool,
    /// Print nothing but errors.
    #[arg(long)]
    quiet: bool,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The stream to describe.
    file: PathBuf,
    /// List every quantum.
    #[arg(long)]
    quanta: bool,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct CodecsArgs {
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

fn parse_size(text: &str) -> Result<usize, String> {
    let size = qsm_stand::plan::parse_size(text)
        .ok_or_else(|| format!("invalid size {text:?} (e.g. 65536, 64K, 1M)"))?;
    let (min, max) = (qsm_codec::engine::MIN_QUANTUM, qsm_codec::frame::MAX_QUANTUM);
    if !(min..=max).contains(&size) {
        return Err(format!("a quantum of {size} bytes is outside {min} to {max} bytes"));
    }
    Ok(size)
}

fn parse_range(text: &str) -> Result<std::ops::Range<u64>, String> {
    let err = || format!("invalid range {text:?} (e.g. 3..7, or 5 for one quantum)");
    match text.split_once("..") {
        Some((a, b)) => {
            let start = a.parse().map_err(|_| err())?;
            let end = b.parse().map_err(|_| err())?;
            Ok(start..end)
        }
        None => {
            let i = text.parse::<u64>().map_err(|_| err())?;
            Ok(i..i.checked_add(1).ok_or_else(err)?)
        }
    }
}

fn is_stdin(path: &Option<PathBuf>) -> bool {
    path.as_deref().is_none_or(|p| p == Path::new("-"))
}

/// A file named on the command line, opened for reading: one that cannot be is bad usage.
fn open_named(path: &Path) -> Result<File> {
    File::open(path)
        .map_err(|e| crate::usage::usage(format!("cannot open {}: {e}", path.display())))
}

/// A file that must be a QSM stream (`info`, `decompress`, a catalog backup), opened and
/// checked to start as one: another kind of file is bad usage, named as such; a stream
/// damaged further on is a failure found while reading it. (A pipe cannot be read twice: the
/// decoder checks its start as it reads it.)
pub fn open_stream(path: &Path) -> Result<File> {
    let mut file = open_named(path)?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Ok(file);
    }
    let mut header = Vec::new();
    Read::by_ref(&mut file)
        .take(qsm_codec::stream::STREAM_HEADER_LEN as u64)
        .read_to_end(&mut header)
        .with_context(|| format!("reading {}", path.display()))?;
    qsm_codec::stream::check_stream_header(&header)
        .map_err(|e| crate::usage::usage(format!("{}: {e}", path.display())))?;
    io::Seek::rewind(&mut file).with_context(|| format!("reading {}", path.display()))?;
    Ok(file)
}

/// The input as a reader, with its size when known; `stream`: it must be a QSM stream.
fn open_input(
    path: &Option<PathBuf>,
    stream: bool,
) -> Result<(Box<dyn Read + Send>, Option<u64>, String)> {
    if is_stdin(path) {
        return Ok((Box::new(io::stdin()), None, "stdin".into()));
    }
    let path = path.as_deref().unwrap_or(Path::new("-"));
    let file = if stream { open_stream(path)? } else { open_named(path)? };
    let len = file.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
    // Small enough that payload reads (hundreds of KiB) bypass the buffer instead of being
    // copied through it: with 1 MiB the single reader thread copied every byte twice and
    // capped parallel LZ4 decompression at 81% of two processes (docs/PERFORMANCE.md).
    Ok((Box::new(BufReader::with_capacity(64 << 10, file)), len, path.display().to_string()))
}

/// A progress bar on a terminal for inputs of 64 MiB or more (or of unknown size).
fn progress_bar(len: Option<u64>, quiet: bool) -> Option<ProgressBar> {
    if quiet || !io::stderr().is_terminal() || len.is_some_and(|n| n < 64 << 20) {
        return None;
    }
    let bar = match len {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        None => ProgressBar::new_spinner(),
    };
    Some(bar)
}

fn mb_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs.max(1e-9)
}

pub fn compress(args: CompressArgs) -> Result<()> {
    let bad = |what: String| move |e: qsm_codec::Error| crate::usage::usage(format!("{what}: {e}"));
    let mut compression =
        Compression::parse(&args.codec).map_err(bad(format!("--codec {:?}", args.codec)))?;
    if let Some(level) = args.level {
        compression = compression.with_level(level).map_err(bad(format!("--level {level}")))?;
    }
    let options = CompressOptions {
        compression,
        quantum_size: args.quantum.unwrap_or(qsm_codec::DEFAULT_QUANTUM),
        threads: crate::usage::threads(args.threads)?,
    };
    let (input, len, name) = open_input(&args.input, false)?;
    let mut output = Output::open(args.output.as_deref(), args.force, true)?;
    let bar = progress_bar(len, args.quiet);
    let start = Instant::now();
    let summary = qsm_codec::compress(input, &mut output, &options, &mut |done| {
        if let Some(b) = &bar {
            b.set_position(done);
        }
    })
    .with_context(|| format!("compressing {name}"))?;
    output.commit()?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if !args.quiet && args.output.is_some() {
        let secs = start.elapsed().as_secs_f64();
        errln!(
            "{name}: {} -> {} bytes ({:.3}:1) with {compression}, {} quanta ({} stored raw), {:.2} s, {:.1} MB/s",
            summary.raw_bytes,
            summary.stream_bytes,
            summary.raw_bytes as f64 / summary.stream_bytes.max(1) as f64,
            summary.quanta,
            summary.raw_quanta,
            secs,
            mb_per_s(summary.raw_bytes, secs),
        );
    }
    Ok(())
}

pub fn decompress(args: DecompressArgs) -> Result<()> {
    let threads = crate::usage::threads(args.threads)?;
    if let Some(r) = args.quanta.as_ref().filter(|r| r.start >= r.end) {
        return Err(crate::usage::usage(format!(
            "--quanta {}..{} holds no quantum: the end must be past the start (3..7 is quanta 3 to 6)",
            r.start, r.end
        )));
    }
    let mut output = if args.test {
        Output::discard()
    } else {
        Output::open(args.output.as_deref(), args.force, false)?
    };
    let start = Instant::now();
    let (summary, name) = match &args.quanta {
        Some(range) => {
            if is_stdin(&args.input) {
                bail!("--quanta needs an input file: the index is at the end of the stream");
            }
            let path = args.input.as_deref().unwrap_or(Path::new("-"));
            let mut file = open_stream(path)?;
            let index = StreamIndex::read(&mut file)
                .with_context(|| format!("reading {}", path.display()))?;
            let summary = qsm_codec::decompress_quanta(
                BufReader::with_capacity(1 << 20, file),
                &index,
                range.clone(),
                &mut output,
                threads,
                &mut |_| {},
            )
            .with_context(|| format!("decompressing {}", path.display()))?;
            (summary, path.display().to_string())
        }
        None => {
            let (input, len, name) = open_input(&args.input, true)?;
            let bar = progress_bar(len, args.quiet);
            let summary = qsm_codec::decompress(input, &mut output, threads, &mut |done| {
                if let Some(b) = &bar {
                    b.set_position(done);
                }
            })
            .with_context(|| format!("decompressing {name}"))?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            (summary, name)
        }
    };
    output.commit()?;
    if !args.quiet && (args.output.is_some() || args.test) {
        let secs = start.elapsed().as_secs_f64();
        errln!(
            "{name}: {} quanta, {} bytes {}, {:.2} s, {:.1} MB/s",
            summary.quanta,
            summary.raw_bytes,
            if args.test { "verified" } else { "restored" },
            secs,
            mb_per_s(summary.raw_bytes, secs),
        );
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct CodecUse {
    codec: String,
    quanta: u64,
    raw_quanta: u64,
    raw_bytes: u64,
    stored_bytes: u64,
}

#[derive(Debug, Serialize)]
struct QuantumInfo {
    index: u64,
    frame_offset: u64,
    raw_offset: u64,
    codec: String,
    raw: bool,
    raw_len: u32,
    stored_len: u32,
}

#[derive(Debug, Serialize)]
struct StreamInfo {
    file: String,
    stream_bytes: u64,
    raw_bytes: u64,
    ratio: f64,
    quanta: u64,
    quantum_size: u64,
    codecs: Vec<CodecUse>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    quanta_list: Vec<QuantumInfo>,
}

fn codec_name(id: u16) -> String {
    registry::by_id(id).map_or_else(|| format!("#{id}"), |c| c.name().to_owned())
}

pub fn info(args: InfoArgs) -> Result<()> {
    let path = &args.file;
    let mut file = open_stream(path)?;
    let index =
        StreamIndex::read(&mut file).with_context(|| format!("reading {}", path.display()))?;
    let stream_bytes = file.metadata().map(|m| m.len()).unwrap_or_default();
    let mut codecs: Vec<CodecUse> = Vec::new();
    let mut list = Vec::new();
    for i in 0..index.len() {
        let h = index
            .frame_header(&mut file, i)
            .with_context(|| format!("reading {}", path.display()))?;
        let name = codec_name(h.codec);
        let at = match codecs.iter().position(|c| c.codec == name) {
            Some(at) => at,
            None => {
                codecs.push(CodecUse {
                    codec: name.clone(),
                    quanta: 0,
                    raw_quanta: 0,
                    raw_bytes: 0,
                    stored_bytes: 0,
                });
                codecs.len() - 1
            }
        };
        let u = &mut codecs[at];
        u.quanta += 1;
        u.raw_quanta += u64::from(h.is_raw());
        u.raw_bytes += u64::from(h.raw_len);
        u.stored_bytes += h.frame_len() as u64;
        if args.quanta {
            let e = index.entries()[i as usize];
            list.push(QuantumInfo {
                index: i,
                frame_offset: e.frame_offset,
                raw_offset: e.raw_offset,
                codec: name,
                raw: h.is_raw(),
                raw_len: h.raw_len,
                stored_len: h.stored_len,
            });
        }
    }
    let info = StreamInfo {
        file: path.display().to_string(),
        stream_bytes,
        raw_bytes: index.raw_len(),
        ratio: index.raw_len() as f64 / stream_bytes.max(1) as f64,
        quanta: index.len(),
        quantum_size: if index.is_empty() { 0 } else { index.raw_span(0).1 },
        codecs,
        quanta_list: list,
    };
    emit(&info, args.json)
}

#[derive(Debug, Serialize)]
struct CodecDesc {
    id: u16,
    name: &'static str,
    min_level: i32,
    max_level: i32,
    default_level: i32,
}

pub fn codecs(args: CodecsArgs) -> Result<()> {
    let list: Vec<CodecDesc> = registry::all()
        .iter()
        .map(|c| {
            let l = c.levels();
            CodecDesc {
                id: c.id(),
                name: c.name(),
                min_level: l.min,
                max_level: l.max,
                default_level: l.default,
            }
        })
        .collect();
    emit(&list[..], args.json)
}

impl Text for StreamInfo {
    fn text(&self) {
        outln!("file:         {}", self.file);
        outln!("original:     {} bytes", self.raw_bytes);
        outln!("stream:       {} bytes (ratio {:.3}:1)", self.stream_bytes, self.ratio);
        outln!("quanta:       {} of {} bytes", self.quanta, self.quantum_size);
        for c in &self.codecs {
            outln!(
                "codec {:<6} {} quanta ({} stored raw), {} -> {} bytes",
                c.codec,
                c.quanta,
                c.raw_quanta,
                c.raw_bytes,
                c.stored_bytes
            );
        }
        for q in &self.quanta_list {
            outln!(
                "  #{:<6} at {:>12}  raw {:>12}  {:<5} {:>9} -> {:>9}{}",
                q.index,
                q.frame_offset,
                q.raw_offset,
                q.codec,
                q.raw_len,
                q.stored_len,
                if q.raw { "  (raw)" } else { "" }
            );
        }
    }
}

impl Text for [CodecDesc] {
    fn text(&self) {
        outln!("{:>3}  {:<6} levels", "id", "name");
        for c in self {
            if c.min_level == c.max_level {
                outln!("{:>3}  {:<6} -", c.id, c.name);
            } else {
                outln!(
                    "{:>3}  {:<6} {}..={} (default {})",
                    c.id,
                    c.name,
                    c.min_level,
                    c.max_level,
                    c.default_level
                );
            }
        }
        outln!("auto: {}, a probe stores incompressible quanta raw", Compression::AUTO);
    }
}
