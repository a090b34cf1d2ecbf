//! The codec conformance suite: every codec in the registry must pass all of it, at its
//! lowest, default and highest level. A new codec gets these tests by being registered.

mod common;

use proptest::prelude::*;
use qsm_codec::{Codec, CodecError, registry};

fn levels(codec: &dyn Codec) -> Vec<i32> {
    let l = codec.levels();
    let mut v = vec![l.min, l.default, l.max];
    v.dedup();
    // zstd's top levels are slow; the suite tests them on small inputs only.
    v
}

fn round_trip(codec: &dyn Codec, level: i32, data: &[u8]) -> Result<Vec<u8>, CodecError> {
    let mut c = codec.compressor(level)?;
    let mut packed = vec![0u8; codec.max_compressed_len(data.len())];
    let n = c.compress(data, &mut packed)?;
    assert!(n <= packed.len());
    let mut out = vec![0u8; data.len()];
    codec.decompressor()?.decompress(&packed[..n], &mut out)?;
    Ok(out)
}

#[test]
fn every_codec_round_trips_edge_inputs_at_every_level() -> Result<(), CodecError> {
    let inputs: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![7; 100_000],
        common::random(70_000, 1),
        common::text(200_000, 2),
        common::mixed(150_000, 3),
        (0..=255u8).cycle().take(65_536).collect(),
    ];
    for codec in registry::all() {
        for level in levels(*codec) {
            for data in &inputs {
                let data = if level > 19 { &data[..data.len().min(20_000)] } else { &data[..] };
                assert_eq!(
                    round_trip(*codec, level, data)?,
                    data,
                    "{} level {level}",
                    codec.name()
                );
            }
        }
    }
    Ok(())
}

#[test]
fn compressors_and_decompressors_are_reusable() -> Result<(), CodecError> {
    // Workers reuse one compressor for every quantum: state must not leak between blocks.
    for codec in registry::all() {
        let mut c = codec.compressor(codec.levels().default)?;
        let mut d = codec.decompressor()?;
        for (i, data) in [common::text(50_000, 9), common::random(30_000, 8), common::text(10, 7)]
            .iter()
            .cycle()
            .take(7)
            .enumerate()
        {
            let mut packed = vec![0u8; codec.max_compressed_len(data.len())];
            let n = c.compress(data, &mut packed)?;
            let mut out = vec![0u8; data.len()];
            d.decompress(&packed[..n], &mut out)?;
            assert_eq!(&out, data, "{} block {i}", codec.name());
        }
    }
    Ok(())
}

#[test]
fn compression_is_deterministic() -> Result<(), CodecError> {
    // Byte-identical streams for any thread count rest on this.
    let data = common::mixed(100_000, 4);
    for codec in registry::all() {
        let level = codec.levels().default;
        let mut a = vec![0u8; codec.max_compressed_len(data.len())];
        let mut b = a.clone();
        let na = codec.compressor(level)?.compress(&data, &mut a)?;
        let mut reused = codec.compressor(level)?;
        reused.compress(&common::text(5000, 1), &mut b)?;
        let nb = reused.compress(&data, &mut b)?;
        assert_eq!(a[..na], b[..nb], "{}", codec.name());
    }
    Ok(())
}

#[test]
fn levels_outside_the_range_are_rejected() {
    for codec in registry::all() {
        let l = codec.levels();
        for bad in [l.min - 1, l.max + 1] {
            match codec.compressor(bad) {
                Err(CodecError::LevelOutOfRange { level, .. }) => assert_eq!(level, bad),
                Err(e) => panic!("{}: wrong error {e}", codec.name()),
                Ok(_) => panic!("{} accepted level {bad}", codec.name()),
            }
        }
    }
}

#[test]
fn small_output_buffers_fail_cleanly() -> Result<(), CodecError> {
    let data = common::random(10_000, 5);
    for codec in registry::all() {
        let mut c = codec.compressor(codec.levels().default)?;
        let mut tiny = vec![0u8; 100];
        assert!(c.compress(&data, &mut tiny).is_err(), "{}", codec.name());
        // And the compressor still works afterwards.
        assert_eq!(round_trip(*codec, codec.levels().default, &data)?, data);
    }
    Ok(())
}

#[test]
fn wrong_lengths_and_trailing_bytes_are_errors() -> Result<(), CodecError> {
    let data = common::text(20_000, 6);
    for codec in registry::all() {
        let mut packed = vec![0u8; codec.max_compressed_len(data.len())];
        let n = codec.compressor(codec.levels().default)?.compress(&data, &mut packed)?;
        let mut d = codec.decompressor()?;
        let name = codec.name();
        assert!(
            d.decompress(&packed[..n], &mut vec![0u8; data.len() - 1]).is_err(),
            "{name}: short output"
        );
        assert!(
            d.decompress(&packed[..n], &mut vec![0u8; data.len() + 1]).is_err(),
            "{name}: long output"
        );
        assert!(
            d.decompress(&packed[..n - 1], &mut vec![0u8; data.len()]).is_err(),
            "{name}: truncated"
        );
        let mut extended = packed[..n].to_vec();
        extended.extend_from_slice(&[0, 0, 0, 0]);
        if name != "lz4" && name != "lzw" {
            // LZ4 blocks have no end marker (trailing bytes are read as more sequences), and
            // weezl reads ahead of the LZW end code: for both, the frame's exact raw length and
            // checksum are what catch damage.
            assert!(
                d.decompress(&extended, &mut vec![0u8; data.len()]).is_err(),
                "{name}: trailing"
            );
        }
        let mut out = vec![0u8; data.len()];
        d.decompress(&packed[..n], &mut out)?;
        assert_eq!(out, data, "{name}: decompressor unusable after errors");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn random_and_structured_data_round_trip(
        seed in any::<u64>(),
        len in 0usize..70_000,
        kind in 0u8..3,
    ) {
        let data = match kind {
            0 => common::random(len, seed),
            1 => common::text(len, seed),
            _ => common::mixed(len, seed),
        };
        for codec in registry::all() {
            let out = round_trip(*codec, codec.levels().default, &data)
                .map_err(|e| TestCaseError::fail(format!("{}: {e}", codec.name())))?;
            prop_assert!(out == data, "{} changed the data", codec.name());
        }
    }

    #[test]
    fn garbage_never_panics(seed in any::<u64>(), len in 0usize..4096, out_len in 0usize..20_000) {
        let garbage = common::random(len, seed);
        for codec in registry::all() {
            let mut out = vec![0u8; out_len];
            if let Ok(mut d) = codec.decompressor() {
                let _ = d.decompress(&garbage, &mut out);
            }
        }
    }

    #[test]
    fn damaged_payloads_never_panic(seed in any::<u64>(), at in any::<usize>(), bit in 0u8..8) {
        let data = common::text(30_000, seed);
        for codec in registry::all() {
            let mut packed = vec![0u8; codec.max_compressed_len(data.len())];
            let n = codec.compressor(codec.levels().default)
                .and_then(|mut c| c.compress(&data, &mut packed))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            packed[at % n] ^= 1 << bit;
            let mut out = vec![0u8; data.len()];
            if let Ok(mut d) = codec.decompressor() {
                let _ = d.decompress(&packed[..n], &mut out);
            }
        }
    }
}
