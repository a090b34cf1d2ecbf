//! Password guessing made slow and cheap for the server: after a few failed logins, an
//! account, and separately a source address, is locked out for a period that doubles with
//! every further failure (1 s, 2 s, 4 s, … up to 15 minutes). A login that arrives while
//! either is locked out is refused at once, before any password hash is computed and without
//! a row in the activity log; only the start of each lockout is logged. Password
//! verifications (argon2, 19 MiB and tens of milliseconds each) run a bounded number at a
//! time, so a flood of logins cannot take every core or every blocking thread from the
//! sessions already running.
//!
//! A success clears its account's and its source's failures. Everything here is in memory: a
//! restarted server starts counting again, which costs an attacker nothing they could not get
//! by waiting out one lockout.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures of an account before its lockouts start: a user who mistypes a few times is
/// never locked out.
const ACCOUNT_FREE: u32 = 5;
/// Failures from one source before its lockouts start: higher, since one address may serve
/// many users (a NAT, a jump host).
const SOURCE_FREE: u32 = 20;
/// The first lockout; each further failure doubles it.
const FIRST_LOCKOUT: Duration = Duration::from_secs(1);
/// The longest lockout.
const MAX_LOCKOUT: Duration = Duration::from_secs(15 * 60);
/// Failures this long ago are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// Accounts and sources tracked at most; past it, those not locked out are forgotten first,
/// so a flood of made-up names or addresses cannot grow the table without bound.
const MAX_TRACKED: usize = 10_000;
/// The longest account name a login may give: names longer than this cannot exist.
pub const MAX_ACCOUNT: usize = 255;
/// The longest password a login may give (argon2 reads all of it).
pub const MAX_PASSWORD: usize = 4096;
/// The longest client description kept for the session list.
pub const MAX_CLIENT: usize = 255;

/// What is counted: an account name, or where logins come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// A node's or administrator's name (`admin:` prefixed for administrators).
    Account(String),
    /// An IP address (without the port) or a local socket's user.
    Source(String),
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    locked_until: Option<Instant>,
}

/// A login refused because of earlier failures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockedOut {
    /// The account or the source.
    pub what: String,
    /// How long until it may try again.
    pub wait: Duration,
}

impl std::fmt::Display for LockedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "too many failed logins for {}: try again in {} s",
            self.what,
            self.wait.as_secs().max(1)
        )
    }
}

/// The failed-login counters and the bound on concurrent verifications.
#[derive(Debug)]
pub struct Logins {
    failures: Mutex<HashMap<Key, Failures>>,
    verifying: tokio::sync::Semaphore,
}

impl Default for Logins {
    /// Half the cores verify passwords at most: the other half stays with the sessions that
    /// are already in, whatever arrives at the door.
    fn default() -> Self {
        Logins::new(std::thread::available_parallelism().map_or(1, |n| n.get() / 2))
    }
}

fn threshold(key: &Key) -> u32 {
    match key {
        Key::Account(_) => ACCOUNT_FREE,
        Key::Source(_) => SOURCE_FREE,
    }
}

fn describe(key: &Key) -> String {
    match key {
        Key::Account(name) => format!("account {name}"),
        Key::Source(source) => format!("source {source}"),
    }
}

impl Logins {
    /// Counters with at most `verifications` password checks at a time.
    pub fn new(verifications: usize) -> Logins {
        Logins {
            failures: Mutex::new(HashMap::new()),
            verifying: tokio::sync::Semaphore::new(verifications.max(1)),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Failures>> {
        // Counters only: a panic elsewhere leaves them usable.
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses a login for any of `keys` that is locked out now.
    pub fn check(&self, keys: &[Key], now: Instant) -> Result<(), LockedOut> {
        let table = self.table();
        for key in keys {
            if let Some(until) = table.get(key).and_then(|f| f.locked_until).filter(|u| *u > now) {
                return Err(LockedOut { what: describe(key), wait: until - now });
            }
        }
        Ok(())
    }

    /// The lockout `keys` are under now, if any.
    pub fn lockout(&self, keys: &[Key]) -> Option<LockedOut> {
        self.check(keys, Instant::now()).err()
    }

    /// Waits for a turn to verify a password (held until dropped); `None` if none came within
    /// `patience` (the server is flooded: the login is refused rather than queued forever).
    pub async fn turn(&self, patience: Duration) -> Option<tokio::sync::SemaphorePermit<'_>> {
        tokio::time::timeout(patience, self.verifying.acquire()).await.ok()?.ok()
    }

    /// Counts a failed login for each of `keys`; returns the lockouts it started, to be
    /// logged (once per lockout, not per attempt).
    pub fn failed(&self, keys: &[Key], now: Instant) -> Vec<LockedOut> {
        let mut table = self.table();
        if table.len() + keys.len() > MAX_TRACKED {
            table.retain(|_, f| {
                f.locked_until.is_some_and(|u| u > now) && now.duration_since(f.last) < FORGET_AFTER
            });
        }
        if table.len() + keys.len() > MAX_TRACKED {
            // Still full, of lockouts: the half ending soonest goes.
            let mut ends: Vec<(Instant, Key)> =
                table.iter().map(|(k, f)| (f.locked_until.unwrap_or(f.last), k.clone())).collect();
            ends.sort_by_key(|(end, _)| *end);
            for (_, key) in ends.into_iter().take(MAX_TRACKED / 2) {
                table.remove(&key);
            }
        }
        let mut started = Vec::new();
        for key in keys {
            let f = table.entry(key.clone()).or_insert(Failures {
                count: 0,
                last: now,
                locked_until: None,
            });
            if now.duration_since(f.last) > FORGET_AFTER {
                *f = Failures { count: 0, last: now, locked_until: None };
            }
            f.count = f.count.saturating_add(1);
            f.last = now;
            let free = threshold(key);
            if f.count >= free {
                let doublings = (f.count - free).min(20);
                let lockout = FIRST_LOCKOUT.saturating_mul(1 << doublings).min(MAX_LOCKOUT);
                f.locked_until = Some(now + lockout);
                started.push(LockedOut { what: describe(key), wait: lockout });
            }
        }
        started
    }

    /// A successful login clears the failures of its account and its source.
    pub fn succeeded(&self, keys: &[Key]) {
        let mut table = self.table();
        for key in keys {
            table.remove(key);
        }
    }
}

/// The source of a connection as throttling counts it: the IP address without the port (a
/// client picks a new port for every connection), or the local socket's user.
pub fn source_of(peer: &str) -> String {
    match peer.parse::<std::net::SocketAddr>() {
        Ok(addr) => addr.ip().to_string(),
        // "local socket, pid P uid U": the user, not the process.
        Err(_) => match peer.rsplit_once(" uid ") {
            Some((_, uid)) => format!("local uid {uid}"),
            None => peer.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lockouts_start_after_the_free_failures_and_double() {
        let logins = Logins::new(1);
        let t0 = Instant::now();
        let keys = [Key::Account("alpha".into()), Key::Source("10.0.0.1".into())];
        for i in 0..ACCOUNT_FREE - 1 {
            assert!(logins.failed(&keys, t0).is_empty(), "failure {i} locked out");
            assert!(logins.check(&keys, t0).is_ok());
        }
        let started = logins.failed(&keys, t0);
        assert_eq!(started, [LockedOut { what: "account alpha".into(), wait: FIRST_LOCKOUT }]);
        let refused = logins.check(&keys, t0).unwrap_err();
        assert_eq!(refused.what, "account alpha");
        assert!(refused.to_string().contains("try again in 1 s"), "{refused}");
        // Another account from the same source is not locked out yet.
        assert!(logins.check(&[Key::Account("beta".into())], t0).is_ok());
        // Past the lockout it may try again; the next failure locks it out twice as long.
        let t1 = t0 + FIRST_LOCKOUT + Duration::from_millis(1);
        assert!(logins.check(&keys, t1).is_ok());
        assert_eq!(logins.failed(&keys, t1)[0].wait, FIRST_LOCKOUT * 2);
        // Many more: capped.
        let mut t = t1;
        for _ in 0..40 {
            t += MAX_LOCKOUT;
            logins.failed(&keys, t);
        }
        assert_eq!(logins.check(&keys, t).unwrap_err().wait, MAX_LOCKOUT);
        // A success clears it.
        logins.succeeded(&keys);
        assert!(logins.check(&keys, t).is_ok());
    }

    #[test]
    fn a_source_is_locked_out_across_accounts_and_old_failures_are_forgotten() {
        let logins = Logins::new(1);
        let t0 = Instant::now();
        let source = Key::Source("10.0.0.2".into());
        for i in 0..SOURCE_FREE {
            logins.failed(&[Key::Account(format!("user{i}")), source.clone()], t0);
        }
        let refused = logins.check(&[Key::Account("fresh".into()), source.clone()], t0);
        assert_eq!(refused.unwrap_err().what, "source 10.0.0.2");
        let later = t0 + FORGET_AFTER + MAX_LOCKOUT;
        assert!(
            logins.failed(std::slice::from_ref(&source), later).is_empty(),
            "old failures counted"
        );
    }

    #[test]
    fn the_table_stays_bounded_under_made_up_names() {
        let logins = Logins::new(1);
        let t0 = Instant::now();
        for i in 0..3 * MAX_TRACKED {
            logins.failed(&[Key::Account(format!("n{i}"))], t0);
        }
        assert!(logins.table().len() <= MAX_TRACKED, "{}", logins.table().len());
    }

    #[test]
    fn sources_drop_the_port_and_the_pid() {
        assert_eq!(source_of("127.0.0.1:53211"), "127.0.0.1");
        assert_eq!(source_of("[::1]:9"), "::1");
        assert_eq!(source_of("local socket, pid 12 uid 1000"), "local uid 1000");
        assert_eq!(source_of("local socket"), "local socket");
    }
}
