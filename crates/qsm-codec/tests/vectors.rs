//! Pins the format with checked-in test vectors (`tests/vectors/`, described in
//! `docs/FORMAT.md`):
//!
//! - `input.bin` and one valid stream per codec, `<name>.qsm`, made with 4 KiB quanta: each
//!   must decode to `input.bin` through both readers, forever (old data must stay readable);
//!   and compressing `input.bin` again must give the same bytes, so an accidental change of
//!   the encoder or the layout fails here.
//! - `must-fail/*.qsm`, damaged streams that both readers must reject with the error named
//!   in `must-fail/EXPECTED`.
//!
//! `QSM_BLESS=1 cargo test -p qsm-codec --test vectors` writes vectors that are missing; it
//! never overwrites one. A deliberate format change adds a new version and new vectors and
//! keeps the old ones.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use qsm_codec::frame::{FRAME_HEADER_LEN, FrameHeader};
use qsm_codec::stream::StreamIndex;
use qsm_codec::{CompressOptions, Compression, Error, compress, decompress, decompress_quanta};

const SETTINGS: [(&str, &str); 9] = [
    ("none", "none"),
    ("lz4", "lz4"),
    ("zstd", "zstd:3"),
    ("zlib", "zlib:6"),
    ("gzip", "gzip:6"),
    ("lzw", "lzw"),
    // lzo.qsm was made by lzokay's search, level 9 since LZO got levels; lzo1.qsm by the
    // LZO1X-1 search, the default.
    ("lzo", "lzo:9"),
    ("lzo1", "lzo:1"),
    ("quicklz", "quicklz"),
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

fn blessing() -> bool {
    std::env::var_os("QSM_BLESS").is_some()
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| {
        panic!("{}: {e} (run with QSM_BLESS=1 to create missing vectors)", path.display())
    })
}

fn write_new(path: &Path, bytes: &[u8]) {
    if path.exists() {
        return;
    }
    if let Err(e) = std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))
        .and_then(|()| std::fs::write(path, bytes))
    {
        panic!("{}: {e}", path.display());
    }
}

/// 13,096 bytes in four 4 KiB quanta: text, random (stored raw under every codec, so a raw
/// frame with a non-zero codec id), zeros then text, and a short text tail.
fn input() -> Vec<u8> {
    let path = dir().join("input.bin");
    if blessing() {
        let mut seed = 0x5153_4d31u64;
        let mut random = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 24) as u8
                })
                .collect()
        };
        let text = b"QSM cuts every file into independent quanta, each compressed and checksummed on its own. ";
        let mut data: Vec<u8> = text.iter().copied().cycle().take(4096).collect();
        data.extend(random(4096));
        data.extend(std::iter::repeat_n(0u8, 3000));
        data.extend(text.iter().copied().cycle().skip(7).take(1904));
        write_new(&path, &data);
    }
    read(&path)
}

fn encode(data: &[u8], setting: &str) -> Result<Vec<u8>, Error> {
    let options = CompressOptions {
        compression: Compression::parse(setting)?,
        quantum_size: 4096,
        threads: Some(1),
    };
    let mut out = Vec::new();
    compress(data, &mut out, &options, &mut |_| {})?;
    Ok(out)
}

fn decode_both(stream: &[u8]) -> [Result<Vec<u8>, Error>; 2] {
    let mut seq = Vec::new();
    let sequential = decompress(stream, &mut seq, Some(2), &mut |_| {}).map(|_| seq);
    let indexed = (|| {
        let mut cursor = Cursor::new(stream);
        let index = StreamIndex::read(&mut cursor)?;
        let mut out = Vec::new();
        decompress_quanta(cursor, &index, 0..index.len(), &mut out, Some(2), &mut |_| {})?;
        Ok(out)
    })();
    [sequential, indexed]
}

#[test]
fn the_empty_stream_is_pinned() -> Result<(), Error> {
    let path = dir().join("empty.qsm");
    let fresh = encode(&[], "zstd")?;
    if blessing() {
        write_new(&path, &fresh);
    }
    let pinned = read(&path);
    assert_eq!(fresh, pinned, "the empty stream changed");
    for decoded in decode_both(&pinned) {
        assert!(decoded?.is_empty());
    }
    Ok(())
}

#[test]
fn valid_vectors_decode_and_the_encoder_reproduces_them() -> Result<(), Error> {
    let data = input();
    for (name, setting) in SETTINGS {
        let path = dir().join(format!("{name}.qsm"));
        let fresh = encode(&data, setting)?;
        if blessing() {
            write_new(&path, &fresh);
        }
        let pinned = read(&path);
        for decoded in decode_both(&pinned) {
            assert_eq!(decoded?, data, "{name}.qsm no longer decodes to input.bin");
        }
        if name != "none" {
            let mut cursor = Cursor::new(&pinned);
            let index = StreamIndex::read(&mut cursor)?;
            let raw: Vec<bool> = (0..index.len())
                .map(|i| index.frame_header(&mut cursor, i).map(|h| h.is_raw()))
                .collect::<Result<_, _>>()?;
            assert_eq!(raw, [false, true, false, false], "{name}.qsm: which quanta are raw");
        }
        assert!(
            fresh == pinned,
            "compressing input.bin with {setting} no longer gives {name}.qsm. If the layout changed, \
             that is a format change (new version, new vectors, old ones kept). If only a codec \
             library changed its output, old vectors still decode: add new ones under new names."
        );
    }
    Ok(())
}

/// Damaged streams, derived from zstd.qsm, with the error each must produce.
fn must_fail_cases(valid: &[u8]) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let first = 8; // the first frame follows the 8-byte stream header
    let header = |edit: &dyn Fn(&mut FrameHeader)| {
        let mut out = valid.to_vec();
        let mut h = match FrameHeader::parse(&valid[first..]) {
            Ok(h) => h,
            Err(e) => panic!("zstd.qsm does not parse: {e}"),
        };
        edit(&mut h);
        out[first..first + FRAME_HEADER_LEN].copy_from_slice(&h.to_bytes());
        out
    };
    let flip = |at: usize| {
        let mut out = valid.to_vec();
        out[at] ^= 0x04;
        out
    };
    let payload_at = first + FRAME_HEADER_LEN + 40;
    let mut trailing = valid.to_vec();
    trailing.extend_from_slice(b"junk");
    let mut future = valid.to_vec();
    future[4] = 9;
    let mut reserved = valid.to_vec();
    reserved[6] = 1;
    let mut trailer_version = valid.to_vec();
    let v = trailer_version.len() - 8;
    trailer_version[v] = 2;
    // A frame header rewritten byte by byte, with a valid header check.
    let raw_header = |at: usize, value: u8| {
        let mut out = valid.to_vec();
        let mut h = [0u8; FRAME_HEADER_LEN];
        h.copy_from_slice(&valid[first..first + FRAME_HEADER_LEN]);
        h[at] = value;
        let check = (xxhash_rust::xxh3::xxh3_64(&h[..24]) as u32).to_le_bytes();
        h[24..28].copy_from_slice(&check);
        out[first..first + FRAME_HEADER_LEN].copy_from_slice(&h);
        out
    };
    vec![
        ("truncated-mid-frame", valid[..first + 100].to_vec(), "truncated"),
        ("truncated-trailer", valid[..valid.len() - 1].to_vec(), "trailer"),
        ("header-bit-flipped", flip(first + 10), "header is damaged"),
        ("payload-bit-flipped", flip(payload_at), "quantum 0"),
        ("wrong-raw-length", header(&|h| h.raw_len -= 1), "quantum 0"),
        ("unknown-codec", header(&|h| h.codec = 77), "unknown codec id 77"),
        ("oversize-length", header(&|h| h.raw_len = 0x7fff_ffff), "exceeds the maximum"),
        ("index-damaged", flip(valid.len() - 40 - 3), "index"),
        ("trailing-garbage", trailing, "trailer"),
        ("future-stream-version", future, "version 9"),
        ("stream-reserved-byte", reserved, "reserved"),
        ("trailer-version", trailer_version, "trailer"),
        ("unknown-frame-flags", header(&|h| h.flags = 0x40), "unknown flag bits 0x40"),
        ("future-frame-version", raw_header(4, 2), "frame format version 2"),
        ("none-without-raw-flag", header(&|h| h.codec = 0), "codec none without the RAW flag"),
        ("not-a-stream", b"hello, world, this is not a QSM stream at all, no sir".to_vec(), "QSM"),
    ]
}

#[test]
fn must_fail_vectors_are_rejected_by_both_readers() {
    let valid = read(&dir().join("zstd.qsm"));
    let cases = must_fail_cases(&valid);
    let expected_path = dir().join("must-fail/EXPECTED");
    if blessing() {
        for (name, bytes, _) in &cases {
            write_new(&dir().join(format!("must-fail/{name}.qsm")), bytes);
        }
        let manifest: String = cases.iter().map(|(n, _, e)| format!("{n}.qsm: {e}\n")).collect();
        write_new(&expected_path, manifest.as_bytes());
    }
    let manifest = String::from_utf8_lossy(&read(&expected_path)).into_owned();
    let mut seen = 0;
    for line in manifest.lines().filter(|l| !l.trim().is_empty()) {
        let Some((file, expected)) = line.split_once(": ") else {
            panic!("bad EXPECTED line {line:?}")
        };
        let bytes = read(&dir().join("must-fail").join(file));
        for (reader, result) in ["sequential", "indexed"].iter().zip(decode_both(&bytes)) {
            match result {
                Ok(_) => panic!("{file} was accepted by the {reader} reader"),
                Err(e) => {
                    let msg = e.to_string();
                    // The indexed reader may stop earlier, at the trailer or index.
                    let ok = msg.contains(expected)
                        || (*reader == "indexed"
                            && (msg.contains("trailer")
                                || msg.contains("index")
                                || msg.contains("truncated")));
                    assert!(ok, "{file} ({reader}): expected {expected:?} in {msg:?}");
                }
            }
        }
        seen += 1;
    }
    assert_eq!(
        seen,
        cases.len(),
        "must-fail/EXPECTED lists {seen} cases, the test defines {}",
        cases.len()
    );
}
