//! Test data shared by the integration tests.
#![allow(dead_code)]

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// Text-like data: words from a small vocabulary, compressible about 3:1 like prose.
pub fn text(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "quantum ",
        "storage ",
        "backup ",
        "the ",
        "of ",
        "server ",
        "client ",
        "frame ",
        "restore ",
        "archive ",
        "policy ",
        "node ",
        "and ",
        "a ",
        "version ",
        "catalog\n",
    ];
    let picks = random(len, seed);
    let mut out = Vec::with_capacity(len + 16);
    let mut i = 0;
    while out.len() < len {
        out.extend_from_slice(WORDS[usize::from(picks[i % picks.len().max(1)] & 15)].as_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

/// Half text, half random, in 8 KiB stripes: some quanta compress, some do not.
pub fn mixed(len: usize, seed: u64) -> Vec<u8> {
    let (t, r) = (text(len, seed), random(len, seed + 1));
    (0..len).map(|i| if (i / 8192) % 2 == 0 { t[i] } else { r[i] }).collect()
}
