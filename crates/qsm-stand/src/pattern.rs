//! Data patterns: what the measured blocks hold.

use std::path::{Path, PathBuf};

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
    /// A file's bytes, repeated as needed.
    File(PathBuf),
}

impl Pattern {
    /// Parses `random`, `zeros`, `compressible:PERCENT`, `file:PATH` (relative to `base`).
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
                match std::fs::metadata(&path) {
                    Ok(m) if m.is_file() && m.len() > 0 => Ok(Pattern::File(path)),
                    Ok(_) => Err(format!("{}: not a non-empty file", path.display())),
                    Err(e) => Err(format!("{}: {e}", path.display())),
                }
            }
            _ => Err(format!(
                "unknown pattern {text:?} (known: random, zeros, compressible:PERCENT, file:PATH)"
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
        }
    }

    /// `len` bytes of this pattern; the same seed gives the same bytes.
    pub fn generate(&self, len: usize, seed: u64) -> std::io::Result<Vec<u8>> {
        let mut rng = XorShift(seed | 1);
        Ok(match self {
            Pattern::Random => rng.bytes(len),
            Pattern::Zeros => vec![0; len],
            Pattern::Compressible(pct) => {
                let mut out = rng.bytes(len);
                for chunk in out.chunks_mut(4096) {
                    let zeros = chunk.len() * usize::from(*pct) / 100;
                    chunk[..zeros].fill(0);
                }
                out
            }
            Pattern::File(path) => {
                let bytes = std::fs::read(path)?;
                if bytes.is_empty() {
                    return Err(std::io::Error::other(format!("{} is empty", path.display())));
                }
                bytes.iter().copied().cycle().take(len).collect()
            }
        })
    }
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
