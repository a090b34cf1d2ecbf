//! Client-side encryption for QSM (issue 6): everything secret stays on the client.
//!
//! - [`key`]: the node's master key, generated on first use, and the key file that keeps it
//!   wrapped under a passphrase (argon2id, then AES-256-GCM). A copy of the same file on the
//!   server lets a new machine restore with only the passphrase; the server cannot open it.
//!   Version 2 of the file also states, in clear but authenticated, its key's fingerprint and
//!   when it was wrapped, so machines can tell a rewrapped key from another one.
//! - [`chunk`]: chunk ids as a BLAKE3 keyed hash of the plaintext, with a key derived from the
//!   master key, so an id says nothing about content to anyone without the key.
//! - [`seal`]: frame payloads sealed with an AEAD (AES-256-GCM by default, ChaCha20-Poly1305
//!   as an option), a fresh random nonce per frame, and the caller's associated data (the
//!   frame header and chunk id) bound to the ciphertext.
//!
//! The subkeys are derived from the master key with BLAKE3's key derivation, one context
//! string per purpose, so no key serves two algorithms.

pub mod chunk;
pub mod key;
pub mod seal;

pub use chunk::{ChunkId, ChunkIdKey};
pub use key::{KdfParams, KeyFile, MasterKey, random};
pub use seal::{Aead, FrameCipher, FrameKeys};

/// Why a cryptographic operation failed. Messages never include key material.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CryptError {
    /// The passphrase does not open the key file (or the file was altered: the two cannot be
    /// told apart, by design).
    #[error("wrong passphrase, or the key file was altered")]
    WrongPassphrase,
    /// The bytes are not a key file this version reads.
    #[error("not a QSM key file: {0}")]
    NotAKeyFile(String),
    /// Sealed data failed authentication: altered, truncated, moved or replayed.
    #[error("authentication failed: the data was altered, truncated, or belongs elsewhere")]
    Tampered,
    /// The system random generator or the cipher failed (should not happen).
    #[error("{0}")]
    Internal(String),
}
