//! Frame payloads sealed with an AEAD.
//!
//! A sealed payload is `nonce (12 bytes) ‖ ciphertext ‖ tag (16 bytes)`: 28 bytes more than
//! the compressed payload. The nonce is random per frame: with 96-bit random nonces the
//! chance of a repeat stays below 2^-32 for 2^32 frames under one key (NIST SP 800-38D's
//! limit), which at 1 MiB quanta is 4 PiB per node key.
//!
//! The associated data is the caller's: the frame header (codec, flags, lengths) and the
//! chunk id, so a frame cannot be moved under another header or id undetected. Which object
//! and offset a chunk belongs to is checked by the client after decryption: the plaintext's
//! keyed id must equal the id the object's chunk list names there.

use aws_lc_rs::aead::{AES_256_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};

use crate::CryptError;
use crate::key::{MasterKey, random};

/// Bytes a sealed payload adds: nonce and tag.
pub const OVERHEAD: usize = 12 + 16;

/// The AEAD that seals frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aead {
    /// The default: fastest where the CPU has AES instructions (12 GB/s here, docs/PERFORMANCE.md 5.1).
    Aes256Gcm,
    /// For CPUs without them.
    ChaCha20Poly1305,
}

impl Aead {
    /// Its name in options and the format.
    pub fn name(self) -> &'static str {
        match self {
            Aead::Aes256Gcm => "aes-256-gcm",
            Aead::ChaCha20Poly1305 => "chacha20-poly1305",
        }
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Aead> {
        [Aead::Aes256Gcm, Aead::ChaCha20Poly1305].into_iter().find(|a| a.name() == name)
    }
}

/// Seals and opens frame payloads with a key derived from the master key.
pub struct FrameCipher {
    key: LessSafeKey,
    aead: Aead,
}

impl std::fmt::Debug for FrameCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FrameCipher({})", self.aead.name())
    }
}

impl FrameCipher {
    /// The frame cipher of a master key. Each AEAD gets its own subkey.
    pub fn new(master: &MasterKey, aead: Aead) -> Result<FrameCipher, CryptError> {
        let (alg, context) = match aead {
            Aead::Aes256Gcm => (&AES_256_GCM, "QSM 2026-11-23 frame aes-256-gcm v1"),
            Aead::ChaCha20Poly1305 => {
                (&CHACHA20_POLY1305, "QSM 2026-11-23 frame chacha20-poly1305 v1")
            }
        };
        let key = UnboundKey::new(alg, &master.derive(context))
            .map_err(|_| CryptError::Internal("frame key refused".into()))?;
        Ok(FrameCipher { key: LessSafeKey::new(key), aead })
    }

    /// Its AEAD.
    pub fn aead(&self) -> Aead {
        self.aead
    }

    /// Appends `plaintext` sealed under `aad` to `out`.
    pub fn seal(&self, aad: &[u8], plaintext: &[u8], out: &mut Vec<u8>) -> Result<(), CryptError> {
        let nonce: [u8; 12] = random()?;
        out.reserve(plaintext.len() + OVERHEAD);
        out.extend_from_slice(&nonce);
        let start = out.len();
        out.extend_from_slice(plaintext);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut out[start..],
            )
            .map_err(|_| CryptError::Internal("sealing a frame".into()))?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Appends the plaintext of `sealed` to `out`, if it was sealed by this key under `aad`
    /// and is intact; nothing is appended otherwise.
    pub fn open(&self, aad: &[u8], sealed: &[u8], out: &mut Vec<u8>) -> Result<(), CryptError> {
        if sealed.len() < OVERHEAD {
            return Err(CryptError::Tampered);
        }
        let (nonce, rest) = sealed.split_at(12);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| CryptError::Tampered)?;
        let start = out.len();
        out.extend_from_slice(rest);
        match self.key.open_in_place(nonce, Aad::from(aad), &mut out[start..]) {
            Ok(plain) => {
                let n = plain.len();
                out.truncate(start + n);
                Ok(())
            }
            Err(_) => {
                // Unauthenticated bytes never reach the caller.
                out.truncate(start);
                Err(CryptError::Tampered)
            }
        }
    }
}

/// The frame sealer of a node: seals with the chosen AEAD, opens frames sealed with either.
/// It is the [`qsm_codec::PayloadSealer`] the backup and restore pipelines hand to the frame
/// encoder and decoder.
#[derive(Debug)]
pub struct FrameKeys {
    seal_with: Aead,
    aes: FrameCipher,
    chacha: FrameCipher,
}

impl FrameKeys {
    /// Both frame keys of `master`; new frames are sealed with `seal_with`.
    pub fn new(master: &MasterKey, seal_with: Aead) -> Result<FrameKeys, CryptError> {
        Ok(FrameKeys {
            seal_with,
            aes: FrameCipher::new(master, Aead::Aes256Gcm)?,
            chacha: FrameCipher::new(master, Aead::ChaCha20Poly1305)?,
        })
    }

    fn cipher(&self, aead: Aead) -> &FrameCipher {
        match aead {
            Aead::Aes256Gcm => &self.aes,
            Aead::ChaCha20Poly1305 => &self.chacha,
        }
    }
}

/// The seal kind of each AEAD in the frame header (FORMAT.md 4.8).
fn seal_kind(aead: Aead) -> u8 {
    match aead {
        Aead::Aes256Gcm => qsm_codec::frame::SEAL_AES_256_GCM,
        Aead::ChaCha20Poly1305 => qsm_codec::frame::SEAL_CHACHA20_POLY1305,
    }
}

impl qsm_codec::PayloadSealer for FrameKeys {
    fn kind(&self) -> u8 {
        seal_kind(self.seal_with)
    }

    fn seal(
        &self,
        aad: &[u8],
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), qsm_codec::FrameError> {
        self.cipher(self.seal_with)
            .seal(aad, plaintext, out)
            .map_err(|_| qsm_codec::FrameError::BadLength("sealing failed".into()))
    }

    fn open(
        &self,
        kind: u8,
        aad: &[u8],
        sealed: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), qsm_codec::FrameError> {
        let aead = [Aead::Aes256Gcm, Aead::ChaCha20Poly1305]
            .into_iter()
            .find(|a| seal_kind(*a) == kind)
            .ok_or(qsm_codec::FrameError::Encrypted)?;
        self.cipher(aead).open(aad, sealed, out).map_err(|_| qsm_codec::FrameError::Tampered)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn cipher(aead: Aead) -> FrameCipher {
        FrameCipher::new(&MasterKey::generate().unwrap(), aead).unwrap()
    }

    proptest! {
        #[test]
        fn sealed_payloads_open_to_the_plaintext(data in proptest::collection::vec(any::<u8>(), 0..5000), aad in proptest::collection::vec(any::<u8>(), 0..64)) {
            for aead in [Aead::Aes256Gcm, Aead::ChaCha20Poly1305] {
                let c = cipher(aead);
                let mut sealed = Vec::new();
                c.seal(&aad, &data, &mut sealed).unwrap();
                prop_assert_eq!(sealed.len(), data.len() + OVERHEAD);
                let mut out = vec![7u8];
                c.open(&aad, &sealed, &mut out).unwrap();
                prop_assert_eq!(&out[1..], &data[..]);
            }
        }
    }

    #[test]
    fn any_change_is_refused_and_nothing_unauthenticated_comes_out() {
        for aead in [Aead::Aes256Gcm, Aead::ChaCha20Poly1305] {
            let c = cipher(aead);
            let (aad, data) = (b"header+chunk id".as_slice(), b"a quantum of plaintext".as_slice());
            let mut sealed = Vec::new();
            c.seal(aad, data, &mut sealed).unwrap();
            let mut out = Vec::new();
            for i in 0..sealed.len() {
                let mut bad = sealed.clone();
                bad[i] ^= 0x10;
                assert_eq!(c.open(aad, &bad, &mut out), Err(CryptError::Tampered), "byte {i}");
                assert!(out.is_empty());
            }
            for len in 0..sealed.len() {
                assert_eq!(c.open(aad, &sealed[..len], &mut out), Err(CryptError::Tampered));
            }
            // Under another header or chunk id (a frame moved), or another node's key.
            assert_eq!(c.open(b"header+other id", &sealed, &mut out), Err(CryptError::Tampered));
            assert_eq!(cipher(aead).open(aad, &sealed, &mut out), Err(CryptError::Tampered));
            assert!(out.is_empty());
            // Two seals of one plaintext differ (fresh nonces).
            let mut again = Vec::new();
            c.seal(aad, data, &mut again).unwrap();
            assert_ne!(again, sealed);
        }
        assert_eq!(Aead::parse("aes-256-gcm"), Some(Aead::Aes256Gcm));
        assert_eq!(Aead::parse("rot13"), None);
    }
}
