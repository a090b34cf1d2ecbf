//! Pins the key file format and the key derivations: a key file of each version made once
//! must open forever, to the same key (its fingerprint and its chunk ids), and the damaged
//! ones below must never open. A change here is a format change: it needs a new version, and
//! these vectors stay.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, UNIX_EPOCH};

use qsm_crypt::{ChunkIdKey, CryptError, KdfParams, KeyFile};

/// Made with the passphrase `qsm test vector` and [`KdfParams::TEST`], 2026-11-23.
const KEY_FILE_V1: &str = "51534d4b01010100080000000100000001000000dab17a93ba04eb09fc4a89762d473a058093a50a179962d94f2b775fc6d9cdbc20bf89aa0d4001613e03f9893680c08d01e866d4f9117aa9e1aa4751d6b1d04d49e9ff89c5622743e99409b3";

fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn a_version_1_key_file_opens_to_the_same_key_forever() {
    let file = KeyFile::from_bytes(&bytes(KEY_FILE_V1)).unwrap();
    assert_eq!(file.params(), KdfParams::TEST);
    // Version 1 states nothing in clear: it orders before any version-2 wrapping.
    assert_eq!(
        (file.version(), file.claimed_fingerprint(), file.claimed_wrapped_at()),
        (1, None, None)
    );
    let key = file.unwrap_key(b"qsm test vector").unwrap();
    assert_eq!(key.fingerprint(), FINGERPRINT);
    let id = ChunkIdKey::of(&key).id(b"qsm chunk");
    let hex: String = id.0.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "b2ea03bc0a7523530c3d370ea0cefe661e58e01953c722f59a7a55421edc4701");
    assert!(file.unwrap_key(b"qsm test vectors").is_err());
}

/// The key of [`KEY_FILE_V1`] rewrapped as version 2 under the passphrase `qsm test vector
/// v2` with [`KdfParams::TEST`], stating that it was wrapped at 2026-11-25 15:00:00 UTC
/// (1 795 618 800 000 000 µs). (Emptied, the test prints a new one under `QSM_BLESS=1`: only
/// for a new version.)
const KEY_FILE_V2: &str = "51534d4b020101000800000001000000010000005593d329f19b32b6c7c7114f49d74fa37d16abde4aa73c723a7bcbc24ef6b1c6c005ee3b32381fff639dabae00dcb9141b610600a27c128ccc1c692238821b65e699cb59960f84627a089136b2678cabc875ffc086c35827b6a64a05f58805a23856f1c6";
const V2_PASSPHRASE: &[u8] = b"qsm test vector v2";
const V2_WRAPPED_AT_MICROS: u64 = 1_795_618_800_000_000;
const FINGERPRINT: &str = "4ef6-b1c6-c005-ee3b-3238-1fff-639d-abae";

/// [`KEY_FILE_V2`] damaged, each with what opening it must say: the clear fingerprint with
/// one bit flipped (byte 48), the time of wrapping a microsecond later (byte 64), the
/// version byte lowered to 1 (byte 4), and the file cut by one byte. The first two parse (a
/// reader cannot tell without the passphrase) and must not open.
const KEY_FILE_V2_MUST_FAIL: [(&str, &str); 4] = [
    (
        "51534d4b020101000800000001000000010000005593d329f19b32b6c7c7114f49d74fa37d16abde4aa73c723a7bcbc24ff6b1c6c005ee3b32381fff639dabae00dcb9141b610600a27c128ccc1c692238821b65e699cb59960f84627a089136b2678cabc875ffc086c35827b6a64a05f58805a23856f1c6",
        "wrong passphrase",
    ),
    (
        "51534d4b020101000800000001000000010000005593d329f19b32b6c7c7114f49d74fa37d16abde4aa73c723a7bcbc24ef6b1c6c005ee3b32381fff639dabae01dcb9141b610600a27c128ccc1c692238821b65e699cb59960f84627a089136b2678cabc875ffc086c35827b6a64a05f58805a23856f1c6",
        "wrong passphrase",
    ),
    (
        "51534d4b010101000800000001000000010000005593d329f19b32b6c7c7114f49d74fa37d16abde4aa73c723a7bcbc24ef6b1c6c005ee3b32381fff639dabae00dcb9141b610600a27c128ccc1c692238821b65e699cb59960f84627a089136b2678cabc875ffc086c35827b6a64a05f58805a23856f1c6",
        "120 bytes, a version-1 key file has 96",
    ),
    (
        "51534d4b020101000800000001000000010000005593d329f19b32b6c7c7114f49d74fa37d16abde4aa73c723a7bcbc24ef6b1c6c005ee3b32381fff639dabae00dcb9141b610600a27c128ccc1c692238821b65e699cb59960f84627a089136b2678cabc875ffc086c35827b6a64a05f58805a23856f1",
        "119 bytes, a version-2 key file has 120",
    ),
];

#[test]
fn a_version_2_key_file_opens_to_the_same_key_forever() {
    if KEY_FILE_V2.is_empty() {
        assert!(
            std::env::var_os("QSM_BLESS").is_some(),
            "the version-2 key file vector is missing"
        );
        let key = KeyFile::from_bytes(&bytes(KEY_FILE_V1))
            .unwrap()
            .unwrap_key(b"qsm test vector")
            .unwrap();
        let at = UNIX_EPOCH + Duration::from_micros(V2_WRAPPED_AT_MICROS);
        let file = key.wrap_at(V2_PASSPHRASE, KdfParams::TEST, at).unwrap();
        let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        println!("KEY_FILE_V2 = \"{}\"", hex(file.as_bytes()));
        let mut fp = file.as_bytes().to_vec();
        fp[48] ^= 0x01;
        let mut time = file.as_bytes().to_vec();
        time[64] = time[64].wrapping_add(1);
        let mut version = file.as_bytes().to_vec();
        version[4] = 1;
        let cut = &file.as_bytes()[..file.as_bytes().len() - 1];
        for damaged in [&fp[..], &time, &version, cut] {
            println!("(\"{}\", \"\"),", hex(damaged));
        }
        return;
    }
    let file = KeyFile::from_bytes(&bytes(KEY_FILE_V2)).unwrap();
    assert_eq!((file.version(), file.as_bytes().len(), file.params()), (2, 120, KdfParams::TEST));
    assert_eq!(file.claimed_fingerprint().as_deref(), Some(FINGERPRINT));
    assert_eq!(
        file.claimed_wrapped_at(),
        Some(UNIX_EPOCH + Duration::from_micros(V2_WRAPPED_AT_MICROS))
    );
    let key = file.unwrap_key(V2_PASSPHRASE).unwrap();
    assert_eq!(key.fingerprint(), FINGERPRINT);
    let id = ChunkIdKey::of(&key).id(b"qsm chunk");
    let hex: String = id.0.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "b2ea03bc0a7523530c3d370ea0cefe661e58e01953c722f59a7a55421edc4701");
    // The version-1 passphrase belongs to the other wrapping.
    assert_eq!(file.unwrap_key(b"qsm test vector").unwrap_err(), CryptError::WrongPassphrase);
}

#[test]
fn damaged_version_2_key_files_never_open() {
    for (i, (hex, expected)) in KEY_FILE_V2_MUST_FAIL.iter().enumerate() {
        assert!(!hex.is_empty(), "must-fail vector {i} is missing (QSM_BLESS=1 prints them)");
        let error = KeyFile::from_bytes(&bytes(hex))
            .and_then(|f| f.unwrap_key(V2_PASSPHRASE))
            .expect_err(&format!("must-fail vector {i} opened"));
        assert!(error.to_string().contains(expected), "vector {i}: {error}");
    }
}

/// A sealed frame (FORMAT.md 4.8) made once with the key above, AES-256-GCM, zstd, on
/// 2026-11-23: it must open forever to the same quantum, under its chunk id. (Emptied, the
/// test prints a new one under `QSM_BLESS=1 ... -- --nocapture`: only for a new version.)
const SEALED_FRAME_V1: &str = "51534d460102020040000000580000000ae2c294df7f13662cf170e770c05c35cd0a2cd1b677885427978c5227cdbaaf9fec3a4289f3aa46da54673533d5ba8ba6cfef131ab0d323948db30b3c1b1146fa0dd32bfb1c3c477736174460bbbf5646dc04232a0d1550eec0a116da4a8bdbd7b358e6";
const SEALED_PLAINTEXT: &[u8] = b"a quantum sealed once for the test vector, a quantum sealed once";

#[test]
fn a_version_1_sealed_frame_opens_to_the_same_quantum_forever() {
    use qsm_codec::{Compression, FrameDecoder, FrameEncoder, FrameHeader};
    use qsm_crypt::{Aead, FrameKeys};
    let key =
        KeyFile::from_bytes(&bytes(KEY_FILE_V1)).unwrap().unwrap_key(b"qsm test vector").unwrap();
    let keys = FrameKeys::new(&key, Aead::Aes256Gcm).unwrap();
    let id = ChunkIdKey::of(&key).id(SEALED_PLAINTEXT);
    if SEALED_FRAME_V1.is_empty() {
        assert!(std::env::var_os("QSM_BLESS").is_some(), "the sealed frame vector is missing");
        let mut frame = Vec::new();
        let h = FrameEncoder::new(Compression::parse("zstd:3").unwrap())
            .unwrap()
            .encode_sealed(SEALED_PLAINTEXT, &mut frame, &keys, &id.0)
            .unwrap();
        let hex: String = frame[..h.frame_len()].iter().map(|b| format!("{b:02x}")).collect();
        println!("SEALED_FRAME_V1 = \"{hex}\"");
        return;
    }
    let frame = bytes(SEALED_FRAME_V1);
    let header = FrameHeader::parse(&frame).unwrap();
    assert_eq!((header.seal(), header.codec, header.is_raw()), (1, 2, false));
    let mut out = Vec::new();
    let h = FrameDecoder::new().decode_sealed(&frame, &mut out, Some(&keys), &id.0).unwrap();
    assert_eq!(&out[..h.raw_len as usize], SEALED_PLAINTEXT);
    // Under another id it does not open.
    let other = ChunkIdKey::of(&key).id(b"another chunk");
    assert!(FrameDecoder::new().decode_sealed(&frame, &mut out, Some(&keys), &other.0).is_err());
}
