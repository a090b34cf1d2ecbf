//! Data patterns: what the measured blocks hold.
//!
//! Files named `*.xz` (the shared corpus is stored so) are read through `xz -dc`, so a plan
//! can point at the corpus as it is.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A source of block data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Incompressible bytes (the TS7700 study's "A00" pattern).
    Random,
    /// All zeros.
    Zeros,
    /// Each 4 KiB holds this percentage of zeros and random bytes for the rest, like fio's
    /// `buffer_compress_percentage`.
    Compressible(u8),
    /// A file's bytes, or a directory's files' one after another, repeated as needed.
    File(PathBuf),
    /// The TS7700 study's RECS4-like mix: consecutive 32 KiB blocks taken in turn from the
    /// files of a directory (each file read on from where its last block ended), so the
    /// ratio is near the files' average and no two neighbouring blocks share a source.
    Recs4(PathBuf),
}

/// RECS4's block: the unit drawn from one file before moving to the next.
pub const RECS4_BLOCK: usize = 32 << 10;

impl Pattern {
    /// Parses `random`, `zeros`, `compressible:PERCENT`, `file:PATH`, `recs4:DIR` (paths
    /// relative to `base`).
    pub fn parse(text: &str, base: &Path) -> Result<Pattern, String> {
        match text.split_once(':') {
            None if text == "random" => Ok(Pattern::Random),
            None if text == "zeros" => Ok(Pattern::Zeros),
            Some(("compressible", pct)) => match pct.parse::<u8>() {
                Ok(p) if p <= 100 => Ok(Pattern::Compressible(p)),
                _ => Err(format!("{text:?}: the percentage must be 0 to 100")),
            },
            Some(("file", path)) => {
                let path = base.join(path);
                match files_of(&path) {
                    Ok(files) if !files.is_empty() => Ok(Pattern::File(path)),
                    Ok(_) => Err(format!("{}: no non-empty file there", path.display())),
                    Err(e) => Err(format!("{}: {e}", path.display())),
                }
            }
            Some(("recs4", dir)) => {
                let dir = base.join(dir);
                match files_of(&dir) {
                    Ok(files) if files.len() >= 2 && dir.is_dir() => Ok(Pattern::Recs4(dir)),
                    Ok(_) => {
                        Err(format!("{}: RECS4 needs a directory of several files", dir.display()))
                    }
                    Err(e) => Err(format!("{}: {e}", dir.display())),
                }
            }
            _ => Err(format!(
                "unknown pattern {text:?} (known: random, zeros, compressible:PERCENT, file:PATH, recs4:DIR)"
            )),
        }
    }

    /// Its name in reports.
    pub fn name(&self) -> String {
        match self {
            Pattern::Random => "random".into(),
            Pattern::Zeros => "zeros".into(),
            Pattern::Compressible(p) => format!("compressible:{p}"),
            Pattern::File(p) => {
                format!("file:{}", p.file_name().map(|n| n.to_string_lossy()).unwrap_or_default())
            }
            Pattern::Recs4(p) => {
                format!("recs4:{}", p.file_name().map(|n| n.to_string_lossy()).unwrap_or_default())
            }
        }
    }

    /// `len` bytes of this pattern; the same seed gives the same bytes.
    pub fn generate(&self, len: usize, seed: u64) -> std::io::Result<Vec<u8>> {
        let mut rng = XorShift(seed | 1);
        Ok(match self {
            Pattern::Random => rng.bytes(len),
            // Written, not just mapped: untouched zero pages would all be one shared page.
            Pattern::Zeros => crate::algo::touched(len),
            Pattern::Compressible(pct) => {
                let mut out = rng.bytes(len);
                for chunk in out.chunks_mut(4096) {
                    let zeros = chunk.len() * usize::from(*pct) / 100;
                    chunk[..zeros].fill(0);
                }
                out
            }
            Pattern::File(path) => {
                let mut bytes = Vec::with_capacity(len);
                for file in files_of(path)? {
                    bytes.extend(read_up_to(&file, len - bytes.len())?);
                    if bytes.len() == len {
                        break;
                    }
                }
                if bytes.is_empty() {
                    return Err(std::io::Error::other(format!("{} is empty", path.display())));
                }
                bytes.iter().copied().cycle().take(len).collect()
            }
            Pattern::Recs4(dir) => {
                let files = files_of(dir)?;
                if files.is_empty() {
                    return Err(std::io::Error::other(format!("{}: no files", dir.display())));
                }
                // Each file gives about its share, whole blocks, and no more is read.
                let share = len.div_ceil(files.len()).next_multiple_of(RECS4_BLOCK);
                let sources = files
                    .iter()
                    .map(|f| read_up_to(f, share))
                    .filter(|r| !matches!(r, Ok(b) if b.is_empty()))
                    .collect::<std::io::Result<Vec<_>>>()?;
                let mut out = Vec::with_capacity(len);
                let mut k = 0usize;
                while out.len() < len && !sources.is_empty() {
                    let src = &sources[k % sources.len()];
                    // A file shorter than its share goes round again.
                    let mut pos = (k / sources.len() * RECS4_BLOCK) % src.len();
                    let mut need = RECS4_BLOCK.min(len - out.len());
                    while need > 0 {
                        let take = need.min(src.len() - pos);
                        out.extend_from_slice(&src[pos..pos + take]);
                        need -= take;
                        pos = 0;
                    }
                    k += 1;
                }
                if out.len() < len {
                    return Err(std::io::Error::other(format!("{}: no data", dir.display())));
                }
                out
            }
        })
    }
}

/// The non-empty regular files at `path`: itself if a file, else the files under it, sorted
/// by path, hidden ones left out.
fn files_of(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() {
        return Ok(if meta.len() > 0 { vec![path.to_owned()] } else { Vec::new() });
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() && meta.len() > 0 {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Up to `limit` bytes of `path`, decompressed through `xz -dc` when it ends in `.xz`.
fn read_up_to(path: &Path, limit: usize) -> std::io::Result<Vec<u8>> {
    let named =
        |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let mut out = Vec::new();
    if path.extension().is_some_and(|e| e == "xz") {
        let mut child = Command::new("xz")
            .arg("-dc")
            .arg(path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("running xz for {}: {e}", path.display()))
            })?;
        if let Some(stdout) = child.stdout.take() {
            stdout.take(limit as u64).read_to_end(&mut out).map_err(named)?;
        }
        if out.len() < limit {
            // xz ended by itself: a damaged file must not pass for a short one.
            let status = child.wait().map_err(named)?;
            if !status.success() || out.is_empty() {
                return Err(std::io::Error::other(format!(
                    "{}: xz -dc failed ({status})",
                    path.display()
                )));
            }
        } else {
            // Enough read: stop xz before its end.
            let _ = child.kill();
            let _ = child.wait();
        }
    } else {
        std::fs::File::open(path)
            .map_err(named)?
            .take(limit as u64)
            .read_to_end(&mut out)
            .map_err(named)?;
    }
    Ok(out)
}

/// xorshift64*: fast, seeded, and good enough to defeat every compressor.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn recs4_takes_32k_blocks_from_each_file_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        for (name, byte) in [("a", b'a'), ("b", b'b'), ("c", b'c')] {
            std::fs::write(dir.path().join(name), vec![byte; 40 << 10]).unwrap();
        }
        let p = Pattern::parse("recs4:.", dir.path()).unwrap();
        let data = p.generate(7 * RECS4_BLOCK, 1).unwrap();
        assert_eq!(data.len(), 7 * RECS4_BLOCK);
        let firsts: Vec<u8> = data.chunks(RECS4_BLOCK).map(|b| b[0]).collect();
        assert_eq!(firsts, b"abcabca");
        assert!(data[..RECS4_BLOCK].iter().all(|&x| x == b'a'));
        assert!(Pattern::parse("recs4:a", dir.path()).unwrap_err().contains("several files"));
    }

    #[test]
    fn a_directory_reads_as_its_files_in_order_and_xz_is_decompressed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("1"), b"one").unwrap();
        std::fs::write(dir.path().join("2"), b"two").unwrap();
        let p = Pattern::parse("file:.", dir.path()).unwrap();
        assert_eq!(p.generate(9, 0).unwrap(), b"onetwoone");
        let xz = Command::new("xz").arg("-k").arg(dir.path().join("2")).status();
        if xz.is_ok_and(|s| s.success()) {
            let p = Pattern::parse("file:2.xz", dir.path()).unwrap();
            assert_eq!(p.generate(4, 0).unwrap(), b"twot");
        }
        assert!(Pattern::parse("file:none", dir.path()).unwrap_err().contains("none"));
    }
}
