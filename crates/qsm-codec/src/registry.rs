//! The codecs this build knows, by permanent id and by name, and the user-facing
//! compression setting (`zstd:3`, `lz4`, `auto`, `none`).

use std::fmt;

use crate::codec::{Codec, CodecId};
use crate::codecs::{Gzip, Lz4, Lzo, Lzw, NoCompression, QuickLz, Zlib, Zstd};
use crate::error::{CodecError, Error};

static CODECS: [&dyn Codec; 8] = [&NoCompression, &Lz4, &Zstd, &Zlib, &Gzip, &Lzw, &Lzo, &QuickLz];

/// Every codec of this build, in id order.
pub fn all() -> &'static [&'static dyn Codec] {
    &CODECS
}

/// The codec with permanent id `id`.
pub fn by_id(id: CodecId) -> Option<&'static dyn Codec> {
    CODECS.iter().copied().find(|c| c.id() == id)
}

/// The codec called `name` (case-insensitive; `deflate` is another name for `zlib`).
pub fn by_name(name: &str) -> Option<&'static dyn Codec> {
    let name = name.to_ascii_lowercase();
    let name = if name == "deflate" { "zlib" } else { name.as_str() };
    CODECS.iter().copied().find(|c| c.name() == name)
}

fn names() -> String {
    let mut list: Vec<&str> = CODECS.iter().map(|c| c.name()).collect();
    list.push("auto");
    list.join(", ")
}

/// What to do with each quantum: a codec, its level, and whether to probe for
/// incompressible data first.
#[derive(Clone, Copy)]
pub struct Compression {
    /// The codec that compresses quanta worth compressing.
    pub codec: &'static dyn Codec,
    /// Its level.
    pub level: i32,
    /// Probe each quantum cheaply (samples, see [`crate::probe`]) and store data that will not
    /// compress raw without running the codec on it.
    pub skip_incompressible: bool,
}

impl fmt::Debug for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.skip_incompressible {
            write!(f, "auto({})", self.setting())
        } else {
            f.write_str(&self.setting())
        }
    }
}

impl Compression {
    /// The codec behind `auto`, and the default of `qsm compress`: zstd at level 3 gives
    /// about 3.2:1 on Silesia at over 200 MB/s per core (docs/PERFORMANCE.md, codec table),
    /// and the probe keeps it from wasting time on data that will not compress.
    pub const AUTO: Compression = Compression { codec: &Zstd, level: 3, skip_incompressible: true };

    /// No compression: every frame is stored raw.
    pub const NONE: Compression =
        Compression { codec: &NoCompression, level: 0, skip_incompressible: false };

    /// The codec and level as `--compression` takes them (`zstd:9`, `lz4`, `none`), whether
    /// or not it probes.
    pub fn setting(&self) -> String {
        if self.codec.levels() == crate::LevelRange::NONE {
            self.codec.name().to_owned()
        } else {
            format!("{}:{}", self.codec.name(), self.level)
        }
    }

    /// `codec` at its default level, without probing.
    pub fn new(codec: &'static dyn Codec) -> Compression {
        Compression { codec, level: codec.levels().default, skip_incompressible: false }
    }

    /// Parses `auto`, `none` (or `off`), `CODEC` or `CODEC:LEVEL`.
    pub fn parse(text: &str) -> Result<Compression, Error> {
        let (name, level) = match text.split_once(':') {
            Some((name, level)) => {
                let level = level.trim().parse::<i32>().map_err(|_| {
                    Error::Invalid(format!("invalid level {level:?} in compression {text:?}"))
                })?;
                (name.trim(), Some(level))
            }
            None => (text.trim(), None),
        };
        let base = match name.to_ascii_lowercase().as_str() {
            "auto" => Compression::AUTO,
            "off" => Compression::NONE,
            other => Compression::new(by_name(other).ok_or_else(|| {
                Error::Invalid(format!("unknown codec {other:?} (known: {})", names()))
            })?),
        };
        match level {
            Some(level) => base.with_level(level),
            None => Ok(base),
        }
    }

    /// The same setting at `level`, checked against the codec's range.
    pub fn with_level(self, level: i32) -> Result<Compression, Error> {
        crate::codec::check_level(self.codec, level).map_err(|e: CodecError| Error::Codec(e))?;
        Ok(Compression { level, ..self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_are_unique_and_round_trip() {
        for (i, a) in all().iter().enumerate() {
            for b in &all()[i + 1..] {
                assert_ne!(a.id(), b.id());
                assert_ne!(a.name(), b.name());
            }
            assert_eq!(by_id(a.id()).map(|c| c.name()), Some(a.name()));
            assert_eq!(by_name(&a.name().to_uppercase()).map(|c| c.id()), Some(a.id()));
        }
    }

    #[test]
    fn parses_settings() -> Result<(), Error> {
        let zstd = Compression::parse("zstd:-5")?;
        assert_eq!((zstd.codec.name(), zstd.level, zstd.skip_incompressible), ("zstd", -5, false));
        assert_eq!(Compression::parse("gzip")?.level, 6);
        assert_eq!(Compression::parse("deflate:9")?.codec.name(), "zlib");
        assert!(Compression::parse("auto")?.skip_incompressible);
        assert_eq!(Compression::parse("off")?.codec.name(), "none");
        assert_eq!(Compression::parse("auto:7")?.to_string(), "auto(zstd:7)");
        Ok(())
    }

    #[test]
    fn rejects_bad_settings() {
        for bad in ["brotli", "zstd:99", "zstd:x", "gzip:0", "lz4:1", ""] {
            assert!(Compression::parse(bad).is_err(), "{bad} accepted");
        }
        let msg = Compression::parse("zstd:99").map(|_| ()).unwrap_err().to_string();
        assert!(msg.contains("out of range") && msg.contains("22"), "{msg}");
    }
}
