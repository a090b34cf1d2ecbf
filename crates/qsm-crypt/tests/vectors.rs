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
