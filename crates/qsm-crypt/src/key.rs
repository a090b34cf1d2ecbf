//! The master key and its key file.
//!
//! Key file layout, version 1 (96 bytes, integers little-endian):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `QSMK` |
//! | 4 | 1 | version, 1 |
//! | 5 | 1 | wrapping AEAD: 1 = AES-256-GCM |
//! | 6 | 1 | KDF: 1 = argon2id (version 0x13) |
//! | 7 | 1 | reserved, 0 |
//! | 8 | 4 | argon2 memory, KiB |
//! | 12 | 4 | argon2 passes |
//! | 16 | 4 | argon2 lanes |
//! | 20 | 16 | salt, random |
//! | 36 | 12 | nonce, random |
//! | 48 | 48 | the 32-byte master key sealed with AES-256-GCM (ciphertext, then 16-byte tag) |
//!
//! The key-encryption key is argon2id(passphrase, salt) with the stored parameters; the AEAD's
//! associated data is bytes 0..48, so the header cannot be altered without the file failing
//! to open. Changing the passphrase rewraps the same master key (new salt and nonce): every
//! stored chunk id and frame stays valid.

use argon2::{Algorithm, Argon2, Params, Version};
use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::CryptError;

const MAGIC: &[u8; 4] = b"QSMK";
const VERSION: u8 = 1;
const AEAD_AES_256_GCM: u8 = 1;
const KDF_ARGON2ID: u8 = 1;
const HEADER_LEN: usize = 48;
/// Bytes of a key file.
pub const KEY_FILE_LEN: usize = 96;

/// Argon2id parameters for wrapping the master key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfParams {
    /// Memory, KiB.
    pub memory_kib: u32,
    /// Passes over the memory.
    pub passes: u32,
    /// Lanes.
    pub lanes: u32,
}

impl KdfParams {
    /// The default: 64 MiB, 3 passes, 1 lane: 0.15–0.17 s here (release build). Above OWASP's
    /// argon2id minimum (19 MiB, 2 passes), because this one passphrase guards every backup
    /// of the node, and it is typed once per session, not per request.
    pub const DEFAULT: KdfParams = KdfParams { memory_kib: 64 * 1024, passes: 3, lanes: 1 };
    /// For tests only: as cheap as argon2 allows.
    pub const TEST: KdfParams = KdfParams { memory_kib: 8, passes: 1, lanes: 1 };
    /// The most memory a key file may ask for (1 GiB): a doctored file must not make the
    /// client allocate without bound.
    pub const MAX_MEMORY_KIB: u32 = 1 << 20;
    /// The most passes a key file may ask for.
    pub const MAX_PASSES: u32 = 64;
    /// The most lanes a key file may ask for.
    pub const MAX_LANES: u32 = 16;

    fn kek(&self, passphrase: &[u8], salt: &[u8; 16]) -> Result<[u8; 32], CryptError> {
        if self.memory_kib > Self::MAX_MEMORY_KIB
            || self.passes > Self::MAX_PASSES
            || self.lanes > Self::MAX_LANES
        {
            return Err(CryptError::NotAKeyFile(format!(
                "argon2 parameters out of range: {self:?}"
            )));
        }
        let params = Params::new(self.memory_kib, self.passes, self.lanes, Some(32))
            .map_err(|e| CryptError::NotAKeyFile(format!("argon2 parameters {self:?}: {e}")))?;
        let mut kek = [0u8; 32];
        Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
            .hash_password_into(passphrase, salt, &mut kek)
            .map_err(|e| CryptError::Internal(format!("argon2id: {e}")))?;
        Ok(kek)
    }
}

/// A node's 256-bit master key. Wiped from memory when dropped.
pub struct MasterKey([u8; 32]);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterKey({})", self.fingerprint())
    }
}

impl Drop for MasterKey {
    fn drop(&mut self) {
        // black_box keeps the compiler from dropping a store to memory about to be freed.
        std::hint::black_box(&mut self.0).fill(0);
    }
}

/// `N` bytes from the system generator (through aws-lc).
pub fn random<const N: usize>() -> Result<[u8; N], CryptError> {
    let mut b = [0u8; N];
    aws_lc_rs::rand::fill(&mut b).map_err(|_| CryptError::Internal("no randomness".into()))?;
    Ok(b)
}

impl MasterKey {
    /// A new random key.
    pub fn generate() -> Result<MasterKey, CryptError> {
        Ok(MasterKey(random()?))
    }

    /// A subkey for one purpose, named by a context string that is never reused.
    pub(crate) fn derive(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.0)
    }

    /// A short public name for the key (16 bytes of a derived value, in hex groups): tells
    /// two keys apart, reveals nothing about either.
    pub fn fingerprint(&self) -> String {
        let d = self.derive("QSM 2026-11-23 key fingerprint v1");
        d[..16].chunks(2).map(|p| format!("{:02x}{:02x}", p[0], p[1])).collect::<Vec<_>>().join("-")
    }

    /// Wraps this key under `passphrase`.
    pub fn wrap(&self, passphrase: &[u8], params: KdfParams) -> Result<KeyFile, CryptError> {
        let salt: [u8; 16] = random()?;
        let nonce: [u8; 12] = random()?;
        let mut b = [0u8; KEY_FILE_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = AEAD_AES_256_GCM;
        b[6] = KDF_ARGON2ID;
        b[8..12].copy_from_slice(&params.memory_kib.to_le_bytes());
        b[12..16].copy_from_slice(&params.passes.to_le_bytes());
        b[16..20].copy_from_slice(&params.lanes.to_le_bytes());
        b[20..36].copy_from_slice(&salt);
        b[36..48].copy_from_slice(&nonce);
        let key = kek_cipher(&params.kek(passphrase, &salt)?)?;
        let (header, body) = b.split_at_mut(HEADER_LEN);
        body[..32].copy_from_slice(&self.0);
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&*header),
                &mut body[..32],
            )
            .map_err(|_| CryptError::Internal("sealing the master key".into()))?;
        body[32..].copy_from_slice(tag.as_ref());
        Ok(KeyFile(b))
    }
}

fn kek_cipher(kek: &[u8; 32]) -> Result<LessSafeKey, CryptError> {
    UnboundKey::new(&AES_256_GCM, kek)
        .map(LessSafeKey::new)
        .map_err(|_| CryptError::Internal("key-encryption key refused".into()))
}

/// A master key wrapped under a passphrase: safe to store anywhere, including the server.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyFile([u8; KEY_FILE_LEN]);

impl std::fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyFile({:?})", self.params())
    }
}

impl KeyFile {
    /// Parses the bytes of a key file, checking everything that can be checked without the
    /// passphrase.
    pub fn from_bytes(bytes: &[u8]) -> Result<KeyFile, CryptError> {
        let b: [u8; KEY_FILE_LEN] = bytes.try_into().map_err(|_| {
            CryptError::NotAKeyFile(format!("{} bytes, a key file has {KEY_FILE_LEN}", bytes.len()))
        })?;
        if &b[..4] != MAGIC {
            return Err(CryptError::NotAKeyFile("wrong magic".into()));
        }
        if b[4] != VERSION {
            return Err(CryptError::NotAKeyFile(format!(
                "version {}, this build reads {VERSION}",
                b[4]
            )));
        }
        if b[5] != AEAD_AES_256_GCM || b[6] != KDF_ARGON2ID || b[7] != 0 {
            return Err(CryptError::NotAKeyFile(format!(
                "unknown algorithms (aead {}, kdf {}, reserved {})",
                b[5], b[6], b[7]
            )));
        }
        Ok(KeyFile(b))
    }

    /// The file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The argon2id parameters it was wrapped with.
    pub fn params(&self) -> KdfParams {
        let u = |at: usize| {
            u32::from_le_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
        };
        KdfParams { memory_kib: u(8), passes: u(12), lanes: u(16) }
    }

    /// The master key, if `passphrase` is the right one and the file is intact.
    pub fn unwrap_key(&self, passphrase: &[u8]) -> Result<MasterKey, CryptError> {
        let mut salt = [0u8; 16];
        salt.copy_from_slice(&self.0[20..36]);
        let mut nonce = [0u8; 12];
        nonce.copy_from_slice(&self.0[36..48]);
        let key = kek_cipher(&self.params().kek(passphrase, &salt)?)?;
        let mut body = [0u8; 48];
        body.copy_from_slice(&self.0[HEADER_LEN..]);
        let opened = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&self.0[..HEADER_LEN]),
                &mut body,
            )
            .map_err(|_| CryptError::WrongPassphrase)?;
        let mut master = [0u8; 32];
        master.copy_from_slice(opened);
        std::hint::black_box(&mut body).fill(0);
        Ok(MasterKey(master))
    }

    /// The same master key under a new passphrase (the old one must open this file).
    pub fn rewrap(&self, old: &[u8], new: &[u8], params: KdfParams) -> Result<KeyFile, CryptError> {
        self.unwrap_key(old)?.wrap(new, params)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_wrapped_key_opens_with_its_passphrase_only() {
        let key = MasterKey::generate().unwrap();
        let file = key.wrap(b"correct horse", KdfParams::TEST).unwrap();
        assert_eq!(file.params(), KdfParams::TEST);
        let back =
            KeyFile::from_bytes(file.as_bytes()).unwrap().unwrap_key(b"correct horse").unwrap();
        assert_eq!(back.0, key.0);
        assert_eq!(back.fingerprint(), key.fingerprint());
        assert_eq!(file.unwrap_key(b"correct horsf").unwrap_err(), CryptError::WrongPassphrase);
        assert_eq!(file.unwrap_key(b"").unwrap_err(), CryptError::WrongPassphrase);
        // Two wraps of one key differ (salt, nonce) but open to the same key.
        let again = key.wrap(b"correct horse", KdfParams::TEST).unwrap();
        assert_ne!(again.as_bytes(), file.as_bytes());
    }

    #[test]
    fn changing_the_passphrase_keeps_the_key() {
        let key = MasterKey::generate().unwrap();
        let file = key.wrap(b"old", KdfParams::TEST).unwrap();
        let new = file.rewrap(b"old", b"new", KdfParams::TEST).unwrap();
        assert_eq!(new.unwrap_key(b"new").unwrap().fingerprint(), key.fingerprint());
        assert_eq!(new.unwrap_key(b"old").unwrap_err(), CryptError::WrongPassphrase);
        assert_eq!(
            file.rewrap(b"wrong", b"new", KdfParams::TEST).unwrap_err(),
            CryptError::WrongPassphrase
        );
    }

    #[test]
    fn every_altered_or_truncated_key_file_is_refused() {
        let key = MasterKey::generate().unwrap();
        let file = key.wrap(b"pass", KdfParams::TEST).unwrap();
        let bytes = file.as_bytes().to_vec();
        for i in 0..bytes.len() {
            for bit in [0x01u8, 0x80] {
                let mut b = bytes.clone();
                b[i] ^= bit;
                // Refused when parsed, or when opened; never a different key, never a panic.
                if let Ok(f) = KeyFile::from_bytes(&b) {
                    assert!(f.unwrap_key(b"pass").is_err(), "byte {i} bit {bit:#x}");
                }
            }
        }
        for len in 0..bytes.len() {
            assert!(matches!(KeyFile::from_bytes(&bytes[..len]), Err(CryptError::NotAKeyFile(_))));
        }
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = KeyFile::from_bytes(&b).unwrap().unwrap_key(b"pass").unwrap_err();
        assert!(matches!(e, CryptError::NotAKeyFile(ref m) if m.contains("out of range")), "{e}");
    }

    #[test]
    fn fingerprints_tell_keys_apart_and_show_no_key_bytes() {
        let (a, b) = (MasterKey::generate().unwrap(), MasterKey::generate().unwrap());
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint().len(), 39, "{}", a.fingerprint());
        let hex: String = a.0.iter().map(|x| format!("{x:02x}")).collect();
        assert!(!hex.contains(&a.fingerprint().replace('-', "")[..8]));
        assert!(format!("{a:?}").starts_with("MasterKey(") && !format!("{a:?}").contains(&hex));
    }
}
