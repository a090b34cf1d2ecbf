//! The node's keys as the pipelines use them, and the server's copy of the key file.
//!
//! With encryption on, every frame is sealed with a key derived from the node's master key
//! (`qsm_crypt::FrameKeys`), and chunk ids are keyed with another key derived from it, so the
//! server sees neither plaintext nor ids it could confirm a guess with. Without encryption,
//! deduplication keys ids with the secret of the node's dedup scope, which the server keeps
//! (it sees the plaintext then anyway).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

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
    /// The fingerprint's 16 bytes, recorded with every file sealed under this key.
    pub key_id: [u8; 16],
}

impl NodeKeys {
    /// The keys of `master`; new frames are sealed with `aead`.
    pub fn new(master: &MasterKey, aead: Aead) -> Result<NodeKeys> {
        Ok(NodeKeys {
            frames: FrameKeys::new(master, aead)
                .map_err(|e| ClientError::Invalid(e.to_string()))?,
            ids: ChunkIdKey::of(master),
            fingerprint: master.fingerprint(),
            key_id: master.fingerprint_bytes(),
        })
    }
}

/// How the server's copy of the node's key file stands against this machine's.
///
/// The server cannot open either file, and may lie about what it holds. So a copy counts as
/// this machine's key only when this machine's passphrase opens it to this key; what a
/// version-2 file states in clear (its key's fingerprint, when it was wrapped) only tells a
/// rewrapped key (`qsm key change-passphrase` on another machine) from another key, to choose
/// what to tell the user and which way a refusal goes; on a claim alone, nothing overwrites
/// the server's copy unless the user asks (`qsm key upload --replace`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerCopy {
    /// The server holds no key file for the node.
    Missing,
    /// The server's copy is this machine's file, byte for byte.
    Same,
    /// Another wrapping of this key that this machine's passphrase opens (an older format,
    /// other argon2 parameters, or the same passphrase set again); `newer` when it states a
    /// later time of wrapping than this machine's file.
    Opens {
        /// Wrapped after this machine's file, by the times the two files state.
        newer: bool,
    },
    /// A file that says it holds this key, wrapped at `at`, but that this machine's passphrase
    /// does not open: by its own claim, this key under another passphrase.
    Rewrapped {
        /// When the server's copy says it was wrapped.
        at: SystemTime,
        /// Wrapped after this machine's file (a version-1 file counts as older than any
        /// version 2): the passphrase was changed elsewhere, and `qsm key recover --refresh`
        /// takes it. Otherwise the server's copy is an older passphrase's.
        newer: bool,
    },
    /// Another key, or a file that cannot be told to be this one: `claimed` is the
    /// fingerprint it states (version 2), `unreadable` why it is not a key file at all.
    Other {
        /// The fingerprint a version-2 file states.
        claimed: Option<String>,
        /// Why the bytes are not a key file this build reads.
        unreadable: Option<String>,
    },
}

/// Compares the server's copy `stored` with this machine's `local` file, which `passphrase`
/// opens to the key `fingerprint`. Runs argon2 once when the server's file may be this key.
pub fn server_copy(
    local: &KeyFile,
    passphrase: &[u8],
    fingerprint: &str,
    stored: Option<&[u8]>,
) -> ServerCopy {
    let Some(stored) = stored else {
        return ServerCopy::Missing;
    };
    if stored == local.as_bytes() {
        return ServerCopy::Same;
    }
    let file = match KeyFile::from_bytes(stored) {
        Ok(f) => f,
        Err(e) => return ServerCopy::Other { claimed: None, unreadable: Some(e.to_string()) },
    };
    let claimed = file.claimed_fingerprint();
    // A file naming another key cannot open to this one (opening checks the name), so the
    // passphrase is not tried on it.
    if claimed.as_deref().is_some_and(|c| c != fingerprint) {
        return ServerCopy::Other { claimed, unreadable: None };
    }
    // `None` (version 1) orders before any time: a version-1 file is older than any other.
    let newer = file.claimed_wrapped_at() > local.claimed_wrapped_at();
    if file.unwrap_key(passphrase).is_ok_and(|k| k.fingerprint() == fingerprint) {
        return ServerCopy::Opens { newer };
    }
    match (claimed, file.claimed_wrapped_at()) {
        (Some(_), Some(at)) => ServerCopy::Rewrapped { at, newer },
        (claimed, _) => ServerCopy::Other { claimed, unreadable: None },
    }
}

/// The time to stamp on a new wrapping of the key `fingerprint` that replaces `local` (and
/// perhaps the server's copy `stored`): now, unless a clock that is behind would make it look
/// older than a wrapping it replaces: then just after the latest of those. Which wrapping is
/// newer is what tells the other machines to take this one rather than to put theirs back.
pub fn rewrap_time(local: &KeyFile, stored: Option<&[u8]>, fingerprint: &str) -> SystemTime {
    let stored = stored
        .and_then(|b| KeyFile::from_bytes(b).ok())
        .filter(|f| f.claimed_fingerprint().as_deref() == Some(fingerprint))
        .and_then(|f| f.claimed_wrapped_at());
    let latest = local.claimed_wrapped_at().max(stored);
    let now = SystemTime::now();
    match latest.and_then(|t| t.checked_add(std::time::Duration::from_micros(1))) {
        Some(after) if after > now => after,
        _ => now,
    }
}

/// Makes sure the server holds a copy of `key_file` (which `passphrase` opens to the key
/// with `fingerprint`), so the node can restore from a new machine with its passphrase alone,
/// and says how the server's copy stands, for the caller to tell the user.
///
/// - None: this machine's file is stored.
/// - This key under an older wrapping that the passphrase opens: replaced by this one.
/// - This key under a newer wrapping (opening or not): left alone, never overwritten; the
///   caller says that `qsm key recover --refresh` takes it. The backup goes on with the key.
/// - By its own claim this key under an older, other passphrase: left alone (the claim
///   cannot be checked); the caller says that `qsm key upload --replace` puts this one.
/// - Another key, or one that cannot be told: left alone and the backup refused, since the
///   server's copy may be the only way to the data sealed with it.
pub fn ensure_server_copy(
    server: &dyn Server,
    key_file: &KeyFile,
    passphrase: &[u8],
    fingerprint: &str,
) -> Result<ServerCopy> {
    let stored = server.get_key()?;
    let found = server_copy(key_file, passphrase, fingerprint, stored.as_deref());
    match &found {
        ServerCopy::Missing | ServerCopy::Opens { newer: false } => {
            server.put_key(key_file.as_bytes())?
        }
        ServerCopy::Same | ServerCopy::Opens { newer: true } | ServerCopy::Rewrapped { .. } => {}
        ServerCopy::Other { claimed, unreadable } => {
            let what = match (claimed, unreadable) {
                (_, Some(why)) => format!("that is not a key file ({why})"),
                (Some(other), None) => format!("of another key, {other}"),
                (None, None) => "that this passphrase does not open and that does not say which \
                                 key it holds (a version-1 file)"
                    .to_owned(),
            };
            // Only a file that does not name its key may still be this key rewrapped.
            let refresh = if claimed.is_none() && unreadable.is_none() {
                "if it is this key under a passphrase changed on another machine, `qsm key \
                 recover --refresh` takes it (it checks that the key is the same); "
            } else {
                ""
            };
            return Err(ClientError::Invalid(format!(
                "{} holds a key file for this node {what}, not the local key {fingerprint}: \
                 {refresh}to back up with the key the server holds, move the local key file \
                 aside and run `qsm key recover`; if the server's copy is really obsolete, \
                 `qsm key upload --replace` replaces it",
                server.describe()
            )));
        }
    }
    Ok(found)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::{Duration, UNIX_EPOCH};

    use qsm_crypt::KdfParams;

    use super::*;

    /// The version-1 vector of `qsm-crypt/tests/vectors.rs`: passphrase `qsm test vector`.
    const V1: &str = "51534d4b01010100080000000100000001000000dab17a93ba04eb09fc4a89762d473a058093a50a179962d94f2b775fc6d9cdbc20bf89aa0d4001613e03f9893680c08d01e866d4f9117aa9e1aa4751d6b1d04d49e9ff89c5622743e99409b3";

    fn v1() -> KeyFile {
        let b: Vec<u8> = (0..V1.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&V1[i..i + 2], 16).unwrap())
            .collect();
        KeyFile::from_bytes(&b).unwrap()
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn wrap(key: &MasterKey, pass: &[u8], secs: u64) -> KeyFile {
        key.wrap_at(pass, KdfParams::TEST, at(secs)).unwrap()
    }

    #[test]
    fn the_server_copy_is_told_by_what_opens_and_by_what_it_claims() {
        let key = MasterKey::generate().unwrap();
        let fp = key.fingerprint();
        let local = wrap(&key, b"old", 1000);
        let check = |stored: Option<&KeyFile>| {
            server_copy(&local, b"old", &fp, stored.map(KeyFile::as_bytes))
        };
        assert_eq!(check(None), ServerCopy::Missing);
        assert_eq!(check(Some(&local)), ServerCopy::Same);
        // The same passphrase, another wrapping: verified, older or newer.
        assert_eq!(check(Some(&wrap(&key, b"old", 999))), ServerCopy::Opens { newer: false });
        assert_eq!(check(Some(&wrap(&key, b"old", 1001))), ServerCopy::Opens { newer: true });
        // Another passphrase: only the claim says it is this key; its time says which is newer.
        assert_eq!(
            check(Some(&wrap(&key, b"new", 2000))),
            ServerCopy::Rewrapped { at: at(2000), newer: true }
        );
        assert_eq!(
            check(Some(&wrap(&key, b"older", 10))),
            ServerCopy::Rewrapped { at: at(10), newer: false }
        );
        // Another key says so, under any passphrase.
        let other = MasterKey::generate().unwrap();
        for pass in [&b"old"[..], b"new"] {
            assert_eq!(
                check(Some(&wrap(&other, pass, 5000))),
                ServerCopy::Other { claimed: Some(other.fingerprint()), unreadable: None }
            );
        }
        // A version-1 file this passphrase does not open says nothing: another key for all we
        // know.
        assert_eq!(check(Some(&v1())), ServerCopy::Other { claimed: None, unreadable: None });
        let garbage = server_copy(&local, b"old", &fp, Some(&local.as_bytes()[..50]));
        assert!(
            matches!(garbage, ServerCopy::Other { claimed: None, unreadable: Some(ref why) } if why.contains("50 bytes")),
            "{garbage:?}"
        );
    }

    #[test]
    fn a_version_1_file_is_older_than_any_version_2_wrapping() {
        let local = v1();
        let key = local.unwrap_key(b"qsm test vector").unwrap();
        let fp = key.fingerprint();
        let rewrapped = wrap(&key, b"changed elsewhere", 1);
        assert_eq!(
            server_copy(&local, b"qsm test vector", &fp, Some(rewrapped.as_bytes())),
            ServerCopy::Rewrapped { at: at(1), newer: true }
        );
        // The other way round: the server's version-1 file of this key, under this passphrase,
        // is an older wrapping, replaced by a backup.
        let here = wrap(&key, b"qsm test vector", 1);
        assert_eq!(
            server_copy(&here, b"qsm test vector", &fp, Some(local.as_bytes())),
            ServerCopy::Opens { newer: false }
        );
    }

    #[test]
    fn a_new_wrapping_is_stamped_after_those_it_replaces_whatever_the_clock() {
        let key = MasterKey::generate().unwrap();
        let fp = key.fingerprint();
        let past = wrap(&key, b"p", 1000);
        let now = SystemTime::now();
        let t = rewrap_time(&past, None, &fp);
        assert!(t >= now && t <= SystemTime::now(), "{t:?}");
        // A wrapping from a clock ahead of this one: just after it.
        let micros = now.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
        let ahead = at(0) + Duration::from_micros(micros + 3_600_000_000);
        let future = key.wrap_at(b"p", KdfParams::TEST, ahead).unwrap();
        assert_eq!(rewrap_time(&future, None, &fp), ahead + Duration::from_micros(1));
        assert_eq!(
            rewrap_time(&past, Some(future.as_bytes()), &fp),
            ahead + Duration::from_micros(1)
        );
        // Another key's file, or a version-1 file, sets no bound.
        let other = MasterKey::generate().unwrap().wrap_at(b"p", KdfParams::TEST, ahead).unwrap();
        assert!(rewrap_time(&past, Some(other.as_bytes()), &fp) < ahead);
        assert!(rewrap_time(&v1(), Some(b"garbage"), &fp) < ahead);
    }

    /// A server that copies this key's fingerprint into the clear field of another key's file
    /// gets the file called "rewrapped" (what the user is told) but never "opens": nothing
    /// will take it as this key.
    #[test]
    fn a_server_lying_about_the_fingerprint_gets_no_further_than_a_message() {
        let key = MasterKey::generate().unwrap();
        let fp = key.fingerprint();
        let local = wrap(&key, b"mine", 1000);
        let other = MasterKey::generate().unwrap();
        let mut forged = wrap(&other, b"mine", 2000).as_bytes().to_vec();
        forged[48..64].copy_from_slice(&local.as_bytes()[48..64]);
        let found = server_copy(&local, b"mine", &fp, Some(&forged));
        assert_eq!(found, ServerCopy::Rewrapped { at: at(2000), newer: true });
        assert!(KeyFile::from_bytes(&forged).unwrap().unwrap_key(b"mine").is_err());
    }
}
