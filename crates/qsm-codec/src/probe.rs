//! A cheap test for incompressible data, so `auto` stores it raw without paying for the codec
//! (the TS7700 stores such data 1:1; borg's `auto` probes with LZ4 first).
//!
//! Up to [`SAMPLES`] samples of [`SAMPLE_LEN`] bytes spread over the quantum (16 KiB of a
//! 1 MiB quantum, under 2% of its bytes) are tested two ways, and the data is called
//! incompressible only when both fail: LZ4 finds no repeats (it would save under 1/32), and
//! the order-0 entropy is above [`MAX_ENTROPY_BITS`], so no Huffman stage could save 1/32
//! either. The entropy test catches what LZ4 alone would misjudge: hex or base64 text has no
//! repeats but only 4 to 6 bits of entropy per byte, and zstd or DEFLATE compress it well.

/// Samples taken from a quantum.
pub const SAMPLES: usize = 4;
/// Bytes per sample.
pub const SAMPLE_LEN: usize = 4096;
/// Entropy (bits per byte) above which an entropy coder saves less than 1/32: 8 × 31/32.
pub const MAX_ENTROPY_BITS: f64 = 7.75;

/// Quanta smaller than this are not probed: the samples would be a large share of them (all
/// of one under 16 KiB), so the probe would cost about what the codec costs, and a codec that
/// saves nothing stores the frame raw anyway. Measured: probing every file of the kernel
/// tree (most are under 16 KiB) made an embedded backup at zstd:3 9% slower (4.79 s against
/// 4.38-4.43 s: runs back to back on the embedded store, the tree's files in the page cache;
/// no cold-cache figure was taken).
pub const PROBE_FROM: usize = 128 * 1024;

/// Whether `data` looks incompressible. `scratch` is reused between calls.
pub fn looks_incompressible(data: &[u8], scratch: &mut Vec<u8>) -> bool {
    if data.len() < PROBE_FROM {
        return false;
    }
    let (mut sampled, mut packed) = (0usize, 0usize);
    let mut histogram = [0u32; 256];
    let need = lz4_flex::block::get_maximum_output_size(SAMPLE_LEN.min(data.len()));
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    for sample in samples(data) {
        // The scratch buffer holds the bound, so this cannot fail; if it did, call it compressible.
        let Ok(n) = lz4_flex::block::compress_into(sample, scratch) else { return false };
        sampled += sample.len();
        packed += n;
        for &b in sample {
            histogram[usize::from(b)] += 1;
        }
    }
    if sampled == 0 || packed * 32 < sampled * 31 {
        return false;
    }
    entropy_bits(&histogram, sampled) > MAX_ENTROPY_BITS
}

fn samples(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let whole = data.len() <= SAMPLES * SAMPLE_LEN;
    let stride = if whole { 0 } else { (data.len() - SAMPLE_LEN) / (SAMPLES - 1) };
    (0..if whole { 1 } else { SAMPLES })
        .map(move |i| if whole { data } else { &data[i * stride..i * stride + SAMPLE_LEN] })
}

fn entropy_bits(histogram: &[u32; 256], total: usize) -> f64 {
    let total = total as f64;
    histogram
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| {
            let p = f64::from(n) / total;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(len: usize, mut seed: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    }

    #[test]
    fn random_is_incompressible_and_text_is_not() {
        let mut scratch = Vec::new();
        assert!(looks_incompressible(&random(1 << 20, 1), &mut scratch));
        let text = b"the quick brown fox jumps over the lazy dog ".repeat(30_000);
        assert!(!looks_incompressible(&text, &mut scratch));
        assert!(!looks_incompressible(&vec![0u8; 1 << 20], &mut scratch));
        assert!(!looks_incompressible(&[], &mut scratch));
    }

    #[test]
    fn small_quanta_are_not_probed_and_still_stored_raw_when_nothing_is_saved() {
        let small = random(PROBE_FROM - 1, 5);
        assert!(!looks_incompressible(&small, &mut Vec::new()));
        assert!(looks_incompressible(&random(PROBE_FROM, 5), &mut Vec::new()));
        // The codec runs on it, saves nothing, and the frame is raw all the same.
        let mut encoder = crate::frame::FrameEncoder::new(crate::Compression::AUTO).unwrap();
        let header = encoder.encode(&small, &mut Vec::new()).unwrap();
        assert!(header.is_raw());
    }

    #[test]
    fn hex_of_random_is_compressible() {
        // No repeats for LZ4 to find, but only 4 bits of information per byte.
        let hex: Vec<u8> =
            random(1 << 19, 3).iter().flat_map(|b| format!("{b:02x}").into_bytes()).collect();
        assert!(!looks_incompressible(&hex, &mut Vec::new()));
    }
}
