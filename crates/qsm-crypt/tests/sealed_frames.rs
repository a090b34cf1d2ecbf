//! Sealed (encrypted) frames, FORMAT.md 4.8, with the real AEADs: round trips, every byte of
//! a sealed frame guarded, frames moved under another id or header refused, and the pool's
//! keyless verification.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use qsm_codec::frame::{FRAME_HEADER_LEN, FrameHeader, SEALED_OVERHEAD, checksum};
use qsm_codec::{Compression, FrameDecoder, FrameEncoder, FrameError};
use qsm_crypt::{Aead, FrameKeys, MasterKey};

fn keys(aead: Aead) -> (MasterKey, FrameKeys) {
    let master = MasterKey::generate().unwrap();
    let keys = FrameKeys::new(&master, aead).unwrap();
    (master, keys)
}

fn seal(keys: &FrameKeys, setting: &str, data: &[u8], id: &[u8]) -> Vec<u8> {
    let mut enc = FrameEncoder::new(Compression::parse(setting).unwrap()).unwrap();
    let mut out = Vec::new();
    let h = enc.encode_sealed(data, &mut out, keys, id).unwrap();
    out.truncate(h.frame_len());
    out
}

fn open(keys: &FrameKeys, frame: &[u8], id: &[u8]) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::new();
    let h = FrameDecoder::new().decode_sealed(frame, &mut out, Some(keys), id)?;
    out.truncate(h.raw_len as usize);
    Ok(out)
}

/// A header rewritten by someone without the key: the header check and the checksum are
/// unkeyed, so they can be made to fit; only the seal notices.
fn forge(frame: &[u8], edit: impl FnOnce(&mut FrameHeader)) -> Vec<u8> {
    let mut h = FrameHeader::parse(frame).unwrap();
    edit(&mut h);
    let mut out = h.to_bytes().to_vec();
    out.extend_from_slice(&frame[FRAME_HEADER_LEN..]);
    out
}

proptest! {
    #[test]
    fn sealed_frames_round_trip(data in proptest::collection::vec(any::<u8>(), 0..20_000), text in any::<bool>()) {
        let data = if text { data.iter().map(|b| b % 4 + b'a').collect() } else { data };
        for aead in [Aead::Aes256Gcm, Aead::ChaCha20Poly1305] {
            let (_, k) = keys(aead);
            for setting in ["zstd:3", "lz4", "off"] {
                let frame = seal(&k, setting, &data, &[7; 32]);
                let h = FrameHeader::parse(&frame).unwrap();
                prop_assert!(h.is_sealed());
                prop_assert_eq!(h.checksum, checksum(&frame[FRAME_HEADER_LEN..]));
                prop_assert_eq!(open(&k, &frame, &[7; 32]).unwrap(), data.clone());
            }
        }
    }
}

#[test]
fn every_damaged_byte_and_every_truncation_is_refused() {
    let (_, k) = keys(Aead::Aes256Gcm);
    let data = b"a quantum of very secret plaintext ".repeat(50);
    let frame = seal(&k, "zstd", &data, &[1; 32]);
    for i in 0..frame.len() {
        let mut bad = frame.clone();
        bad[i] ^= 0x20;
        assert!(open(&k, &bad, &[1; 32]).is_err(), "byte {i}");
        // The pool, without the key, sees the damage too: every byte is under a check.
        assert!(FrameDecoder::new().verify(&bad, &mut Vec::new()).is_err(), "verify byte {i}");
    }
    for len in 0..frame.len() {
        assert!(open(&k, &frame[..len], &[1; 32]).is_err(), "length {len}");
    }
    assert!(FrameDecoder::new().verify(&frame, &mut Vec::new()).is_ok());
}

#[test]
fn frames_moved_replayed_or_reheaded_fail_authentication() {
    let (_, k) = keys(Aead::Aes256Gcm);
    let data = b"version one of the file ".repeat(100);
    let frame = seal(&k, "zstd", &data, &[1; 32]);
    // Moved to another chunk (swapped between positions or objects, or replayed where an
    // older version's id stood).
    assert_eq!(open(&k, &frame, &[2; 32]), Err(FrameError::Tampered));
    assert_eq!(open(&k, &frame, &[]), Err(FrameError::Tampered));
    // The header rewritten with its checks recomputed: another codec, a RAW flag, another
    // raw length.
    let raw_flag = forge(&frame, |h| {
        h.flags |= qsm_codec::frame::FLAG_RAW;
        h.raw_len = h.stored_len - SEALED_OVERHEAD as u32;
    });
    assert_eq!(open(&k, &raw_flag, &[1; 32]), Err(FrameError::Tampered));
    let longer = forge(&frame, |h| h.raw_len += 1);
    assert_eq!(open(&k, &longer, &[1; 32]), Err(FrameError::Tampered));
    let codec = forge(&frame, |h| h.codec = 1);
    assert_eq!(open(&k, &codec, &[1; 32]), Err(FrameError::Tampered));
    // Another node's key, or no key at all.
    let (_, other) = keys(Aead::Aes256Gcm);
    assert_eq!(open(&other, &frame, &[1; 32]), Err(FrameError::Tampered));
    let mut out = Vec::new();
    assert_eq!(FrameDecoder::new().decode(&frame, &mut out), Err(FrameError::Encrypted));
}

#[test]
fn either_aead_opens_what_it_sealed_whatever_the_writer_uses_now() {
    let master = MasterKey::generate().unwrap();
    let gcm = FrameKeys::new(&master, Aead::Aes256Gcm).unwrap();
    let chacha = FrameKeys::new(&master, Aead::ChaCha20Poly1305).unwrap();
    let data = b"switching ciphers keeps old backups readable".repeat(10);
    let by_chacha = seal(&chacha, "lz4", &data, &[3; 32]);
    assert_eq!(FrameHeader::parse(&by_chacha).unwrap().seal(), 2);
    assert_eq!(open(&gcm, &by_chacha, &[3; 32]).unwrap(), data);
    let by_gcm = seal(&gcm, "lz4", &data, &[3; 32]);
    assert_eq!(FrameHeader::parse(&by_gcm).unwrap().seal(), 1);
    assert_eq!(open(&chacha, &by_gcm, &[3; 32]).unwrap(), data);
    // Seal kind 3 is reserved: refused as a header, before any key is tried.
    let reserved = forge(&by_gcm, |h| h.flags |= 0x06);
    assert!(matches!(FrameHeader::parse(&reserved), Err(FrameError::UnknownFlags(_))));
}

#[test]
fn the_server_learns_no_checksum_of_the_plaintext() {
    let (_, k) = keys(Aead::Aes256Gcm);
    let data = b"known plaintext".repeat(100);
    let frame = seal(&k, "off", &data, &[4; 32]);
    let h = FrameHeader::parse(&frame).unwrap();
    assert_ne!(h.checksum, checksum(&data), "the plaintext's XXH3 would confirm a guess");
    assert!(!frame.windows(15).any(|w| w == b"known plaintext"));
    // Two seals of one quantum differ (fresh nonces): equal frames reveal nothing.
    assert_ne!(seal(&k, "off", &data, &[4; 32]), frame);
}
