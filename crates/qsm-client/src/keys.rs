//! The node's keys as the pipelines use them, and the server's copy of the key file.
//!
//! With encryption on, every frame is sealed with a key derived from the node's master key
//! (`qsm_crypt::FrameKeys`), and chunk ids are keyed with another key derived from it, so the
//! server sees neither plaintext nor ids it could confirm a guess with. Without encryption,
//! deduplication keys ids with the secret of the node's dedup scope, which the server keeps
//! (it sees the plaintext then anyway).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use qsm_codec::{FrameError, PayloadSealer};
use qsm_crypt::{Aead, ChunkIdKey, FrameKeys, KeyFile, MasterKey};

use crate::error::{ClientError, Result};
use crate::server::Server;

/// What a node needs to encrypt and to check what it restores.
#[derive(Debug)]
pub struct NodeKeys {
    /// Seals and opens frames.
    pub frames: FrameKeys,
    /// Keys chunk ids of encrypted backups.
    pub ids: ChunkIdKey,
    /// The master key's public fingerprint, for messages.
    pub fingerprint: String,
}

impl NodeKeys {
    /// The keys of `master`; new frames are sealed with `aead`.
    pub fn new(master: &MasterKey, aead: Aead) -> Result<NodeKeys> {
        Ok(NodeKeys {
            frames: FrameKeys::new(master, aead)
                .map_err(|e| ClientError::Invalid(e.to_string()))?,
            ids: ChunkIdKey::of(master),
            fingerprint: master.fingerprint(),
        })
    }
}

/// Makes sure the server holds a copy of `key_file` (which `passphrase` opens to the key
/// with `fingerprint`), so the node can restore from a new machine with its passphrase alone.
/// A copy of the same key under an older wrapping is replaced if the passphrase opens it; a
/// copy that is another key, or that this passphrase does not open, is left alone and the
/// backup refused: the server's copy may be the only way to the data sealed with it.
pub fn ensure_server_copy(
    server: &dyn Server,
    key_file: &KeyFile,
    passphrase: &[u8],
    fingerprint: &str,
) -> Result<()> {
    let Some(stored) = server.get_key()? else {
        return server.put_key(key_file.as_bytes());
    };
    if stored == key_file.as_bytes() {
        return Ok(());
    }
    let same_key = KeyFile::from_bytes(&stored)
        .and_then(|k| k.unwrap_key(passphrase))
        .is_ok_and(|k| k.fingerprint() == fingerprint);
    if same_key {
        return server.put_key(key_file.as_bytes());
    }
    Err(ClientError::Invalid(format!(
        "{} holds a key file for this node that is not the local key {fingerprint} under this \
         passphrase; back up with the key the server holds (`qsm key recover` fetches it), or \
         replace the server's copy with `qsm key upload --replace` if it is really obsolete",
        server.describe()
    )))
}

/// A sealer that counts the bytes it seals and the time it spends, for the backup summary's
/// encryption throughput. Shared by every worker.
#[derive(Debug)]
pub struct TimedSealer<'a> {
    inner: &'a FrameKeys,
    /// Plaintext bytes sealed.
    pub bytes: AtomicU64,
    /// Nanoseconds spent sealing, summed over workers.
    pub nanos: AtomicU64,
}

impl<'a> TimedSealer<'a> {
    /// Counts for `inner`.
    pub fn new(inner: &'a FrameKeys) -> TimedSealer<'a> {
        TimedSealer { inner, bytes: AtomicU64::new(0), nanos: AtomicU64::new(0) }
    }
}

impl PayloadSealer for TimedSealer<'_> {
    fn kind(&self) -> u8 {
        self.inner.kind()
    }

    fn seal(
        &self,
        aad: &[u8],
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), FrameError> {
        let started = Instant::now();
        let result = self.inner.seal(aad, plaintext, out);
        self.nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(plaintext.len() as u64, Ordering::Relaxed);
        result
    }

    fn open(
        &self,
        kind: u8,
        aad: &[u8],
        sealed: &[u8],
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), FrameError> {
        self.inner.open(kind, aad, sealed, out)
    }
}
