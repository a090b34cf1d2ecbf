//! A fast LZO1X compressor in the manner of liblzo's `lzo1x_1`: one hash probe per position,
//! greedy matches of 4 bytes or more, and a search that skips ahead faster the longer it goes
//! without a match. It exists because the only permissively licensed LZO crate
//! (`lzokay-native`) searches like `lzo1x_999`, about a hundred times slower, and the STAND
//! paper measured `lzo1x_1`; liblzo itself is GPL.
//!
//! Written from the stream format as decoders read it (`docs/FORMAT.md` 4.6.6, and the `lzo`
//! crate's decoder): every stream it writes is standard LZO1X, read by any LZO1X decoder.
//! Instructions used:
//! - the first byte `17 + n` for an initial run of n ≤ 238 literals;
//! - literal runs `n - 3` (4 ≤ n ≤ 18) or `0` plus a length extension (n > 18); runs of 1 to
//!   3 literals after a match go into the low two bits of the match's distance byte;
//! - M2 `(len-1)<<5 | (d&7)<<2`, `d>>3` for lengths 3–8 at distances up to 2048;
//! - M3 `32 | (len-2)` (or `32` plus an extension), `d<<2`, `d>>6` up to 16384;
//! - M4 `16 | hi | (len-2)` (or an extension), `d<<2`, `d>>6` up to 49151;
//! - the end marker `17 0 0`.

use crate::error::CodecError;

/// The farthest distance LZO1X can express (M4).
const MAX_DISTANCE: usize = 0xbfff;
/// The shortest match worth taking: a 4-byte compare, as lzo1x_1.
const MIN_MATCH: usize = 4;

fn full() -> CodecError {
    CodecError::Internal { codec: "lzo", detail: "output buffer too small".into() }
}

/// The output, bounds-checked.
struct Out<'a> {
    dst: &'a mut [u8],
    op: usize,
}

impl Out<'_> {
    fn byte(&mut self, b: u8) -> Result<(), CodecError> {
        *self.dst.get_mut(self.op).ok_or_else(full)? = b;
        self.op += 1;
        Ok(())
    }

    fn bytes(&mut self, b: &[u8]) -> Result<(), CodecError> {
        self.dst.get_mut(self.op..self.op + b.len()).ok_or_else(full)?.copy_from_slice(b);
        self.op += b.len();
        Ok(())
    }

    /// The length extension: zero bytes worth 255 each, then a non-zero remainder (`v ≥ 1`).
    fn extension(&mut self, v: usize) -> Result<(), CodecError> {
        let zeros = (v - 1) / 255;
        for _ in 0..zeros {
            self.byte(0)?;
        }
        self.byte((v - zeros * 255) as u8)
    }

    /// Literals before the next match (or the end). `after_match` says whether a match was
    /// written last, whose distance byte can carry a count of 1 to 3.
    fn literals(&mut self, lit: &[u8], after_match: bool) -> Result<(), CodecError> {
        let n = lit.len();
        if n == 0 {
            return Ok(());
        }
        if self.op == 0 && n <= 238 {
            self.byte(17 + n as u8)?;
        } else if n <= 3 && after_match {
            // The match's low distance byte, two bytes back, has two free bits for this.
            *self.dst.get_mut(self.op - 2).ok_or_else(full)? |= n as u8;
        } else if n <= 18 {
            self.byte((n - 3) as u8)?;
        } else {
            self.byte(0)?;
            self.extension(n - 18)?;
        }
        self.bytes(lit)
    }

    fn matched(&mut self, len: usize, dist: usize) -> Result<(), CodecError> {
        if len <= 8 && dist <= 2048 {
            let d = dist - 1;
            self.byte((((len - 1) << 5) | ((d & 7) << 2)) as u8)?;
            return self.byte((d >> 3) as u8);
        }
        let (d, base, short_max, extend_from) = if dist <= 0x4000 {
            (dist - 1, 32usize, 33, 33)
        } else {
            let d = dist - 0x4000;
            (d & 0x3fff, 16 | ((d >> 11) & 8), 9, 9)
        };
        if len <= short_max {
            self.byte((base | (len - 2)) as u8)?;
        } else {
            self.byte(base as u8)?;
            self.extension(len - extend_from)?;
        }
        self.byte(((d << 2) & 0xff) as u8)?;
        self.byte((d >> 6) as u8)
    }
}

fn read32(src: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&src[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Compresses `src` into `dst` as one LZO1X stream with its end marker; `table` is scratch
/// for the match finder (its contents do not matter). Returns the bytes written.
pub fn compress(src: &[u8], dst: &mut [u8], table: &mut Vec<u32>) -> Result<usize, CodecError> {
    // A table about a quarter of the input, 2^8 to 2^14 entries: clearing it is cheap for
    // small blocks, and larger ones gain little from more.
    let bits = (usize::BITS - src.len().leading_zeros()).saturating_sub(2).clamp(8, 14);
    table.clear();
    table.resize(1 << bits, 0);
    let hash = |v: u32| (v.wrapping_mul(0x1824_429d) >> (32 - bits)) as usize;
    let mut out = Out { dst, op: 0 };
    let (mut ip, mut lit_start, mut after_match) = (0usize, 0usize, false);
    while ip + MIN_MATCH <= src.len() {
        let seq = read32(src, ip);
        let h = hash(seq);
        // Positions are stored plus one, so 0 means empty.
        let candidate = table[h] as usize;
        table[h] = ip as u32 + 1;
        if candidate > 0 {
            let c = candidate - 1;
            let dist = ip - c;
            if dist <= MAX_DISTANCE && read32(src, c) == seq {
                let mut len = MIN_MATCH;
                while ip + len < src.len() && src[c + len] == src[ip + len] {
                    len += 1;
                }
                out.literals(&src[lit_start..ip], after_match)?;
                out.matched(len, dist)?;
                after_match = true;
                ip += len;
                lit_start = ip;
                continue;
            }
        }
        // The longer no match is found, the faster the search moves (as lzo1x_1 does).
        ip += 1 + ((ip - lit_start) >> 5);
    }
    out.literals(&src[lit_start..], after_match)?;
    out.bytes(&[17, 0, 0])?;
    Ok(out.op)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn round_trip(src: &[u8]) -> usize {
        let mut dst = vec![0u8; src.len() + src.len() / 16 + 64 + 3];
        let n = compress(src, &mut dst, &mut Vec::new()).unwrap();
        let mut back = vec![0u8; src.len()];
        let got = lzo::decompress_into(&dst[..n], &mut back)
            .unwrap_or_else(|e| panic!("{} bytes: {e}", src.len()));
        assert_eq!(got, src.len());
        assert!(back == src, "{} bytes differ", src.len());
        n
    }

    fn noise(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    }

    #[test]
    fn every_instruction_it_writes_decodes() {
        // Empty, tiny, and literal runs on either side of each length form (first run ≤ 238,
        // 1–3 after a match, ≤ 18, extended).
        for n in [0, 1, 2, 3, 4, 5, 17, 18, 19, 237, 238, 239, 300, 1000] {
            round_trip(&noise(n, 7));
        }
        for lits in [1, 2, 3, 4, 18, 19, 300] {
            let mut v = b"0123456789abcdef".repeat(4);
            v.extend(noise(lits, 3));
            v.extend(b"0123456789abcdef".repeat(4));
            round_trip(&v);
        }
        // Matches: short near (M2), long near (M3 with and without extension), far (M4 on
        // both sides of 32 KiB, with and without extension), and overlapping runs.
        for (gap, len) in [(100, 6), (100, 30), (100, 40), (3000, 8), (3000, 700)] {
            let head = noise(len, 11);
            let mut v = head.clone();
            v.extend(noise(gap, 5));
            v.extend(&head);
            round_trip(&v);
        }
        for gap in [16_380, 16_390, 20_000, 32_760, 32_800, 49_000] {
            for len in [5, 9, 10, 12, 600] {
                let head = noise(len, 13);
                let mut v = head.clone();
                v.extend(noise(gap, 17));
                v.extend(&head);
                v.extend(noise(2, 19));
                round_trip(&v);
            }
        }
        assert!(round_trip(&vec![0u8; 1 << 20]) < 5000, "a megabyte of zeros");
    }

    #[test]
    fn random_mixes_round_trip() {
        let mut seed = 1u64;
        for _ in 0..200 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = (seed >> 40) as usize % 70_000;
            let base = noise(len, seed | 1);
            // Repeats copied from earlier in the buffer at random distances and lengths.
            let mut v = base.clone();
            let mut s = seed;
            for i in 0..len {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if i > 64 && s % 7 < 4 {
                    v[i] = v[i - 1 - (s >> 20) as usize % i.min(60_000)];
                }
            }
            round_trip(&v);
        }
    }
}
