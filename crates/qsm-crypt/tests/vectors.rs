//! Pins the key file format and the key derivations: a version-1 key file made once must open
//! forever, to the same key (its fingerprint and its chunk ids). A change here is a format
//! change: it needs a new version, and this vector stays.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use qsm_crypt::{ChunkIdKey, KdfParams, KeyFile};

/// Made with the passphrase `qsm test vector` and [`KdfParams::TEST`], 2026-11-23.
const KEY_FILE_V1: &str = "51534d4b01010100080000000100000001000000dab17a93ba04eb09fc4a89762d473a058093a50a179962d94f2b775fc6d9cdbc20bf89aa0d4001613e03f9893680c08d01e866d4f9117aa9e1aa4751d6b1d04d49e9ff89c5622743e99409b3";

fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn a_version_1_key_file_opens_to_the_same_key_forever() {
    let file = KeyFile::from_bytes(&bytes(KEY_FILE_V1)).unwrap();
    assert_eq!(file.params(), KdfParams::TEST);
    let key = file.unwrap_key(b"qsm test vector").unwrap();
    assert_eq!(key.fingerprint(), "4ef6-b1c6-c005-ee3b-3238-1fff-639d-abae");
    let id = ChunkIdKey::of(&key).id(b"qsm chunk");
    let hex: String = id.0.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "b2ea03bc0a7523530c3d370ea0cefe661e58e01953c722f59a7a55421edc4701");
    assert!(file.unwrap_key(b"qsm test vectors").is_err());
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
