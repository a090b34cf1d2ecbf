//! The master key and its key file.
//!
//! Two layouts share their first 48 bytes (integers little-endian; FORMAT.md §12):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `QSMK` |
//! | 4 | 1 | version: 1 (96 bytes) or 2 (120 bytes) |
//! | 5 | 1 | wrapping AEAD: 1 = AES-256-GCM |
//! | 6 | 1 | KDF: 1 = argon2id (version 0x13) |
//! | 7 | 1 | reserved, 0 |
//! | 8 | 4 | argon2 memory, KiB |
//! | 12 | 4 | argon2 passes |
//! | 16 | 4 | argon2 lanes |
//! | 20 | 16 | salt, random |
//! | 36 | 12 | nonce, random |
//!
//! Version 1 then holds the 32-byte master key sealed with AES-256-GCM (ciphertext, then the
//! 16-byte tag) at 48. Version 2 first states, in clear, the key's fingerprint (16 bytes at
//! 48) and when it was wrapped (microseconds since 1970-01-01 UTC, 8 bytes at 64), then the
//! sealed key at 72. The clear fields exist so that a machine whose key file is under an old
//! passphrase can tell, without the new one, that the server holds the *same* key rewrapped
//! (`qsm key change-passphrase` elsewhere) rather than another key, and which wrapping is newer.
//!
//! The key-encryption key is argon2id(passphrase, salt) with the stored parameters; the AEAD's
//! associated data is every byte before the sealed key, so neither the header nor the clear
//! fields can be altered without the file failing to open, and opening a version-2 file also
//! checks that the fingerprint it states is its key's. Until then the clear fields are a
//! claim by whoever wrote the file (perhaps a hostile server): good for choosing what to tell
//! the user, never for deciding what a key is. Changing the passphrase rewraps the same master
//! key (new salt and nonce): every stored chunk id and frame stays valid. Writers write
//! version 2; version-1 files keep opening, and become version 2 when next written.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use argon2::{Algorithm, Argon2, Params, Version};
use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::CryptError;

const MAGIC: &[u8; 4] = b"QSMK";
const AEAD_AES_256_GCM: u8 = 1;
const KDF_ARGON2ID: u8 = 1;
/// Bytes both versions share: magic to nonce.
const COMMON_LEN: usize = 48;
/// Bytes of the sealed master key: 32 of ciphertext, 16 of tag.
const SEALED_LEN: usize = 48;
/// Bytes of the clear fields of version 2: fingerprint, then time of wrapping.
const CLEAR_LEN: usize = 16 + 8;
/// Bytes of a version-1 key file.
pub const KEY_FILE_V1_LEN: usize = COMMON_LEN + SEALED_LEN;
/// Bytes of a version-2 key file (the version written).
pub const KEY_FILE_V2_LEN: usize = COMMON_LEN + CLEAR_LEN + SEALED_LEN;
/// The fingerprint's derivation context (FORMAT.md §12): never change it, fingerprints
/// printed and stored in version-2 files depend on it.
const FINGERPRINT_CONTEXT: &str = "QSM 2026-11-23 key fingerprint v1";

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

    /// The fingerprint as 16 bytes (what [`MasterKey::fingerprint`] shows in hex): public, it
    /// names the key in catalogs and key files.
    pub fn fingerprint_bytes(&self) -> [u8; 16] {
        let mut f = [0u8; 16];
        f.copy_from_slice(&self.derive(FINGERPRINT_CONTEXT)[..16]);
        f
    }

    /// A short public name for the key (16 bytes of a derived value, in hex groups): tells
    /// two keys apart, reveals nothing about either.
    pub fn fingerprint(&self) -> String {
        format_fingerprint(&self.fingerprint_bytes())
    }

    /// Wraps this key under `passphrase` (a version-2 file, stamped now).
    pub fn wrap(&self, passphrase: &[u8], params: KdfParams) -> Result<KeyFile, CryptError> {
        self.wrap_at(passphrase, params, SystemTime::now())
    }

    /// Wraps this key under `passphrase`, stating `at` as the time of wrapping: what tells
    /// an older wrapping of the key from a newer one. A change of passphrase stamps just after
    /// the wrapping it replaces when the clock is behind; tests and vectors choose the time.
    pub fn wrap_at(
        &self,
        passphrase: &[u8],
        params: KdfParams,
        at: SystemTime,
    ) -> Result<KeyFile, CryptError> {
        let micros = at
            .duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|d| u64::try_from(d.as_micros()).ok())
            .ok_or_else(|| {
                CryptError::Internal(format!(
                    "the time of wrapping {at:?} is before 1970 or too far ahead: is the clock set?"
                ))
            })?;
        let salt: [u8; 16] = random()?;
        let nonce: [u8; 12] = random()?;
        let mut b = [0u8; KEY_FILE_V2_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = 2;
        b[5] = AEAD_AES_256_GCM;
        b[6] = KDF_ARGON2ID;
        b[8..12].copy_from_slice(&params.memory_kib.to_le_bytes());
        b[12..16].copy_from_slice(&params.passes.to_le_bytes());
        b[16..20].copy_from_slice(&params.lanes.to_le_bytes());
        b[20..36].copy_from_slice(&salt);
        b[36..48].copy_from_slice(&nonce);
        b[48..64].copy_from_slice(&self.fingerprint_bytes());
        b[64..72].copy_from_slice(&micros.to_le_bytes());
        let key = kek_cipher(&params.kek(passphrase, &salt)?)?;
        let (header, body) = b.split_at_mut(COMMON_LEN + CLEAR_LEN);
        body[..32].copy_from_slice(&self.0);
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&*header),
                &mut body[..32],
            )
            .map_err(|_| CryptError::Internal("sealing the master key".into()))?;
        body[32..].copy_from_slice(tag.as_ref());
        Ok(KeyFile(b.to_vec()))
    }
}

/// 16 bytes as a fingerprint: hex, in groups of two bytes.
fn format_fingerprint(f: &[u8; 16]) -> String {
    f.chunks(2).map(|p| format!("{:02x}{:02x}", p[0], p[1])).collect::<Vec<_>>().join("-")
}

fn kek_cipher(kek: &[u8; 32]) -> Result<LessSafeKey, CryptError> {
    UnboundKey::new(&AES_256_GCM, kek)
        .map(LessSafeKey::new)
        .map_err(|_| CryptError::Internal("key-encryption key refused".into()))
}

/// A master key wrapped under a passphrase: safe to store anywhere, including the server.
/// Always a complete file of a version this build reads ([`KeyFile::from_bytes`] checks).
#[derive(Clone, PartialEq, Eq)]
pub struct KeyFile(Vec<u8>);

impl std::fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KeyFile(v{}, {:?}, claims {:?} wrapped at {:?})",
            self.version(),
            self.params(),
            self.claimed_fingerprint(),
            self.claimed_wrapped_at()
        )
    }
}

impl KeyFile {
    /// Parses the bytes of a key file, checking everything that can be checked without the
    /// passphrase.
    pub fn from_bytes(bytes: &[u8]) -> Result<KeyFile, CryptError> {
        if bytes.len() < 5 {
            return Err(CryptError::NotAKeyFile(format!(
                "{} bytes, a key file has {KEY_FILE_V1_LEN} (version 1) or {KEY_FILE_V2_LEN} \
                 (version 2)",
                bytes.len()
            )));
        }
        if &bytes[..4] != MAGIC {
            return Err(CryptError::NotAKeyFile("wrong magic".into()));
        }
        let want = match bytes[4] {
            1 => KEY_FILE_V1_LEN,
            2 => KEY_FILE_V2_LEN,
            v => {
                return Err(CryptError::NotAKeyFile(format!(
                    "version {v}, this build reads 1 and 2"
                )));
            }
        };
        if bytes.len() != want {
            return Err(CryptError::NotAKeyFile(format!(
                "{} bytes, a version-{} key file has {want}",
                bytes.len(),
                bytes[4]
            )));
        }
        if bytes[5] != AEAD_AES_256_GCM || bytes[6] != KDF_ARGON2ID || bytes[7] != 0 {
            return Err(CryptError::NotAKeyFile(format!(
                "unknown algorithms (aead {}, kdf {}, reserved {})",
                bytes[5], bytes[6], bytes[7]
            )));
        }
        Ok(KeyFile(bytes.to_vec()))
    }

    /// The file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The format version: 1 or 2.
    pub fn version(&self) -> u8 {
        self.0[4]
    }

    /// The argon2id parameters it was wrapped with.
    pub fn params(&self) -> KdfParams {
        KdfParams { memory_kib: self.u32_at(8), passes: self.u32_at(12), lanes: self.u32_at(16) }
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }

    /// Bytes before the sealed key: the AEAD's associated data.
    fn header_len(&self) -> usize {
        self.0.len() - SEALED_LEN
    }

    /// The fingerprint the file states in clear (version 2; `None` for version 1), before
    /// anyone opened it: whoever wrote the file chose it, so it only chooses what to tell the
    /// user. [`KeyFile::unwrap_key`] checks it against the key.
    pub fn claimed_fingerprint(&self) -> Option<String> {
        let mut f = [0u8; 16];
        f.copy_from_slice(self.0.get(COMMON_LEN..COMMON_LEN + 16).filter(|_| self.version() == 2)?);
        Some(format_fingerprint(&f))
    }

    /// When the file states it was wrapped (version 2; `None` for version 1, which is older
    /// than any version-2 file, so `None` orders first). A claim like the fingerprint, and
    /// by the writing machine's clock.
    pub fn claimed_wrapped_at(&self) -> Option<SystemTime> {
        let b =
            self.0.get(COMMON_LEN + 16..COMMON_LEN + CLEAR_LEN).filter(|_| self.version() == 2)?;
        let mut m = [0u8; 8];
        m.copy_from_slice(b);
        UNIX_EPOCH.checked_add(Duration::from_micros(u64::from_le_bytes(m)))
    }

    /// The master key, if `passphrase` is the right one and the file is intact (for version
    /// 2, the fingerprint it states is also checked: a file that names another key is refused).
    pub fn unwrap_key(&self, passphrase: &[u8]) -> Result<MasterKey, CryptError> {
        let mut salt = [0u8; 16];
        salt.copy_from_slice(&self.0[20..36]);
        let mut nonce = [0u8; 12];
        nonce.copy_from_slice(&self.0[36..48]);
        let key = kek_cipher(&self.params().kek(passphrase, &salt)?)?;
        let header = self.header_len();
        let mut body = [0u8; SEALED_LEN];
        body.copy_from_slice(&self.0[header..]);
        let opened = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&self.0[..header]),
                &mut body,
            )
            .map_err(|_| CryptError::WrongPassphrase)?;
        let mut master = [0u8; 32];
        master.copy_from_slice(opened);
        std::hint::black_box(&mut body).fill(0);
        let master = MasterKey(master);
        // Sealed under the right passphrase, so made by someone who knew it; still, a file
        // whose clear name is not its key's would mislead every later comparison.
        if let Some(claimed) = self.claimed_fingerprint()
            && claimed != master.fingerprint()
        {
            return Err(CryptError::NotAKeyFile(format!(
                "it states the fingerprint {claimed} but holds the key {}: it was not written \
                 by QSM",
                master.fingerprint()
            )));
        }
        Ok(master)
    }

    /// The same master key under a new passphrase (the old one must open this file), as a
    /// version-2 file stamped now.
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
    fn a_version_2_file_states_its_key_and_time_in_clear_and_they_are_checked() {
        let key = MasterKey::generate().unwrap();
        let at = UNIX_EPOCH + Duration::from_micros(1_795_000_000_123_456);
        let file = key.wrap_at(b"pass", KdfParams::TEST, at).unwrap();
        assert_eq!((file.version(), file.as_bytes().len()), (2, KEY_FILE_V2_LEN));
        assert_eq!(file.claimed_fingerprint(), Some(key.fingerprint()));
        assert_eq!(file.claimed_wrapped_at(), Some(at));
        // `wrap` stamps the present.
        let now = key.wrap(b"pass", KdfParams::TEST).unwrap();
        let stamped = now.claimed_wrapped_at().unwrap();
        assert!(stamped > at && stamped <= SystemTime::now(), "{stamped:?}");
        // Each clear field is bound to the wrapping: altered, the file does not open.
        for at in [48, 63, 64, 71] {
            let mut b = file.as_bytes().to_vec();
            b[at] ^= 0x01;
            let altered = KeyFile::from_bytes(&b).unwrap();
            assert_eq!(altered.unwrap_key(b"pass").unwrap_err(), CryptError::WrongPassphrase);
        }
    }

    /// A file sealed properly under the passphrase but naming another key in clear (only
    /// someone who knows the passphrase could make one): refused when opened.
    #[test]
    fn a_file_whose_clear_fingerprint_is_not_its_key_is_refused() {
        let (key, other) = (MasterKey::generate().unwrap(), MasterKey::generate().unwrap());
        let mut b = key.wrap(b"pass", KdfParams::TEST).unwrap().as_bytes().to_vec();
        b[48..64].copy_from_slice(&other.fingerprint_bytes());
        let mut salt = [0u8; 16];
        salt.copy_from_slice(&b[20..36]);
        let mut nonce = [0u8; 12];
        nonce.copy_from_slice(&b[36..48]);
        let cipher = kek_cipher(&KdfParams::TEST.kek(b"pass", &salt).unwrap()).unwrap();
        let (header, body) = b.split_at_mut(72);
        body[..32].copy_from_slice(&key.0);
        let tag = cipher
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&*header),
                &mut body[..32],
            )
            .unwrap();
        body[32..].copy_from_slice(tag.as_ref());
        let forged = KeyFile::from_bytes(&b).unwrap();
        assert_eq!(forged.claimed_fingerprint(), Some(other.fingerprint()));
        let e = forged.unwrap_key(b"pass").unwrap_err();
        assert!(
            matches!(e, CryptError::NotAKeyFile(ref m) if m.contains(&key.fingerprint())),
            "{e}"
        );
    }

    #[test]
    fn versions_and_lengths_are_checked_before_the_passphrase() {
        let key = MasterKey::generate().unwrap();
        let v2 = key.wrap(b"pass", KdfParams::TEST).unwrap().as_bytes().to_vec();
        let mut v1_sized = v2[..KEY_FILE_V1_LEN].to_vec();
        let e = KeyFile::from_bytes(&v1_sized).unwrap_err();
        assert!(matches!(e, CryptError::NotAKeyFile(ref m) if m.contains("version-2")), "{e}");
        // A version-2 file relabelled version 1 has the wrong length for it.
        let mut relabelled = v2.clone();
        relabelled[4] = 1;
        assert!(KeyFile::from_bytes(&relabelled).is_err());
        // Cut to 96 bytes and relabelled: parses as version 1, opens to nothing.
        v1_sized[4] = 1;
        let f = KeyFile::from_bytes(&v1_sized).unwrap();
        assert_eq!((f.claimed_fingerprint(), f.claimed_wrapped_at()), (None, None));
        assert!(f.unwrap_key(b"pass").is_err());
        let mut v3 = v2.clone();
        v3[4] = 3;
        let e = KeyFile::from_bytes(&v3).unwrap_err();
        assert!(matches!(e, CryptError::NotAKeyFile(ref m) if m.contains("version 3")), "{e}");
        let mut longer = v2;
        longer.push(0);
        assert!(KeyFile::from_bytes(&longer).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any bytes, or a valid file with several bytes changed, cut or extended: parsing
        /// never panics, and nothing but the file itself opens (to its own key).
        #[test]
        fn no_changed_key_file_opens(
            edits in proptest::collection::vec((0usize..130, proptest::prelude::any::<u8>()), 0..4),
            resize in proptest::option::of(0usize..130),
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..130),
        ) {
            let _ = KeyFile::from_bytes(&raw).map(|f| (f.claimed_fingerprint(), f.claimed_wrapped_at()));
            let key = MasterKey::generate().unwrap();
            let file = key.wrap(b"pass", KdfParams::TEST).unwrap();
            let mut b = file.as_bytes().to_vec();
            if let Some(len) = resize {
                b.resize(len, 0);
            }
            for (at, v) in edits {
                if let Some(x) = b.get_mut(at) {
                    *x = v;
                }
            }
            let Ok(f) = KeyFile::from_bytes(&b) else { return Ok(()) };
            let _ = (f.claimed_fingerprint(), f.claimed_wrapped_at(), format!("{f:?}"));
            // Only cheap parameters are tried: a changed memory field may ask for a GiB.
            if f.params().memory_kib <= 64 && f.params().passes <= 2 && f.params().lanes <= 2 {
                match f.unwrap_key(b"pass") {
                    Ok(k) => {
                        proptest::prop_assert_eq!(f.as_bytes(), file.as_bytes());
                        proptest::prop_assert_eq!(k.0, key.0);
                    }
                    Err(_) => proptest::prop_assert_ne!(f.as_bytes(), file.as_bytes()),
                }
            }
        }
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
