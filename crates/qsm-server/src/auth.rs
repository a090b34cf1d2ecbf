//! Passwords (argon2id, never stored in clear) and the sessions they open.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use qsm_catalog::{NodeId, SessionId, Timestamp};

use crate::conns::Conn;

/// The PHC string of `password` under argon2id with a random salt.
pub fn hash_password(password: &str) -> Result<String, String> {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|e| format!("no randomness for a salt: {e}"))?;
    Argon2::default()
        .hash_password_with_salt(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| format!("hashing the password: {e}"))
}

/// Whether `password` matches `hash`. A hash that is not a PHC string (the embedded node's
/// `!embedded`) matches nothing.
pub fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .is_ok_and(|h| Argon2::default().verify_password(password.as_bytes(), &h).is_ok())
}

/// Whether `hash` (a replicated node's, made by another server) is one this server would make:
/// argon2id, costing no more than its own. A hash's parameters decide what each login as the
/// node costs: a huge one would let anyone who tries the name exhaust the server.
pub fn acceptable_hash(hash: &str) -> bool {
    let Ok(h) = PasswordHash::new(hash) else { return false };
    let Ok(params) = argon2::Params::try_from(&h) else { return false };
    let ours = argon2::Params::DEFAULT;
    h.algorithm.as_str() == "argon2id"
        && params.m_cost() <= ours.m_cost()
        && params.t_cost() <= ours.t_cost()
        && params.p_cost() <= ours.p_cost()
}

/// Spends the time of one verification on an account that does not exist, so a refused login
/// takes as long whether the name is known or not.
pub fn verify_nothing(password: &str) {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let hash = DUMMY.get_or_init(|| hash_password("not a password").unwrap_or_default());
    let _ = verify_password(password, hash);
}

/// A new session token: 256 random bits, hex.
pub fn new_token() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// One logged-in client.
#[derive(Debug)]
pub struct Session {
    /// Its number in `qsm admin query session`.
    pub id: u64,
    /// The node or administrator name.
    pub account: String,
    /// The node, for a node's session; `None` for an administrator's.
    pub node: Option<NodeId>,
    /// The catalog's record of a node session.
    pub record: Option<SessionId>,
    /// What the client said it is.
    pub client: String,
    /// Where it connects from.
    pub peer: String,
    /// Login time.
    pub started: Timestamp,
    /// Frame bytes received.
    pub bytes: AtomicU64,
    /// Objects committed.
    pub objects: AtomicU64,
    /// The bytes and objects already added to the catalog's record.
    recorded: Mutex<(u64, u64)>,
    /// Ended: its record closed, its end logged (once, however many paths end it).
    ended: AtomicBool,
    cancelled: AtomicBool,
    last_used: Mutex<Instant>,
    links: Mutex<Links>,
}

/// The connections a session's requests came over that are still open, and since when it
/// has had none (module `conns`).
#[derive(Debug, Default)]
struct Links {
    open: HashSet<u64>,
    orphaned: Option<Instant>,
}

impl Session {
    /// Cancelled by an administrator: every further request fails, running streams stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// The bytes and objects counted since the last call: what the catalog's record lacks.
    pub fn unrecorded(&self) -> (u64, u64) {
        let (bytes, objects) =
            (self.bytes.load(Ordering::Relaxed), self.objects.load(Ordering::Relaxed));
        let mut recorded = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        let delta = (bytes.saturating_sub(recorded.0), objects.saturating_sub(recorded.1));
        *recorded = (bytes, objects);
        delta
    }

    /// Whether its number is the catalog's (module `coord`): not for a session opened while
    /// the catalog could not record it (a full disk), which other servers then do not see.
    pub fn in_catalog(&self) -> bool {
        self.id < LOCAL_IDS
    }

    /// Marks the session ended; true the first time only.
    pub fn end(&self) -> bool {
        !self.ended.swap(true, Ordering::Relaxed)
    }

    /// "running" or "cancelled".
    pub fn state(&self) -> &'static str {
        if self.is_cancelled() { "cancelled" } else { "running" }
    }

    /// Marks the session as in use now: idle sessions are ended. A stream in progress calls
    /// this, and keeps nothing else alive: its connection closing orphans the session however
    /// many of its messages are still read afterwards.
    pub fn used(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn links(&self) -> std::sync::MutexGuard<'_, Links> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// In use over `conn`: alive again if orphaned, unless `conn` has closed (a request
    /// read before a killed client's connection closed and run after is no client coming
    /// back). An untracked connection always reclaims.
    fn reclaim(&self, conn: Option<&Conn>) {
        self.used();
        let mut links = self.links();
        let Some(c) = conn else {
            links.orphaned = None;
            return;
        };
        links.open.insert(c.id);
        // Looked at under the links' lock, which `Sessions::orphan` takes too: whether the
        // close came before or after, the connection does not stay in `open`.
        if c.carry() {
            links.open.remove(&c.id);
            if links.open.is_empty() {
                links.orphaned.get_or_insert_with(Instant::now);
            }
        } else {
            links.orphaned = None;
        }
    }

    fn orphaned_for(&self) -> Option<Duration> {
        self.links().orphaned.map(|t| t.elapsed())
    }

    fn idle(&self) -> Duration {
        self.last_used.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }
}

/// The sessions open on this server, by token.
#[derive(Debug)]
pub struct Sessions {
    by_token: Mutex<HashMap<String, Arc<Session>>>,
    next_id: AtomicU64,
}

/// Numbers of sessions the catalog could not record start here, far above any the catalog
/// gives, so the two never meet.
const LOCAL_IDS: u64 = 1 << 48;

impl Default for Sessions {
    fn default() -> Self {
        Sessions { by_token: Mutex::default(), next_id: AtomicU64::new(LOCAL_IDS) }
    }
}

/// What a new session needs.
#[derive(Debug)]
pub struct NewSession {
    /// Its number: the catalog's, or [`Sessions::local_id`]'s.
    pub id: u64,
    pub account: String,
    pub node: Option<NodeId>,
    pub record: Option<SessionId>,
    pub client: String,
    pub peer: String,
    /// The connection it logged in over (module `conns`).
    pub conn: Option<Conn>,
}

impl Sessions {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.by_token.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a session; refused (saying why) when `max` are already open, or `per_node` of
    /// its node. Cancelled sessions do not count: they stay only so that their token is
    /// answered "cancelled", and are dropped here once no request holds them any more.
    pub fn open(
        &self,
        s: NewSession,
        token: String,
        max: usize,
        per_node: usize,
    ) -> Result<Arc<Session>, String> {
        let mut map = self.map();
        map.retain(|_, s| !s.is_cancelled() || Arc::strong_count(s) > 1);
        let live = || map.values().filter(|s| !s.is_cancelled());
        if live().count() >= max {
            return Err(format!("the server has as many sessions as it allows ({max})"));
        }
        if s.node.is_some() && live().filter(|o| o.node == s.node).count() >= per_node {
            return Err(format!(
                "node {} has as many sessions as a node may have ({per_node}): end one, or \
                 wait for those of a killed client to be ended",
                s.account
            ));
        }
        let session = Arc::new(Session {
            id: s.id,
            recorded: Mutex::new((0, 0)),
            ended: AtomicBool::new(false),
            account: s.account,
            node: s.node,
            record: s.record,
            client: s.client,
            peer: s.peer,
            started: qsm_catalog::now(),
            bytes: AtomicU64::new(0),
            objects: AtomicU64::new(0),
            cancelled: AtomicBool::new(false),
            last_used: Mutex::new(Instant::now()),
            links: Mutex::new(Links::default()),
        });
        map.insert(token, Arc::clone(&session));
        // In the map first, so that a close from now on finds it; a login read before its
        // connection closed and run after is orphaned from the start.
        session.reclaim(s.conn.as_ref());
        Ok(session)
    }

    /// Connection `conn` closed: the sessions it was the last open connection of are orphaned
    /// until a request over another reclaims them.
    pub fn orphan(&self, conn: u64) {
        for s in self.map().values() {
            let mut links = s.links();
            if links.open.remove(&conn) && links.open.is_empty() {
                links.orphaned.get_or_insert_with(Instant::now);
            }
        }
    }

    /// The session of a token, marked as used by a request over `conn` (see
    /// [`Session::reclaim`]).
    pub fn get(&self, token: &str, conn: Option<&Conn>) -> Option<Arc<Session>> {
        let session = self.map().get(token).cloned()?;
        session.reclaim(conn);
        Some(session)
    }

    /// Ends the session of a token.
    pub fn close(&self, token: &str) -> Option<Arc<Session>> {
        self.map().remove(token)
    }

    /// Every open session, by number.
    pub fn list(&self) -> Vec<Arc<Session>> {
        let mut list: Vec<_> = self.map().values().cloned().collect();
        list.sort_by_key(|s| s.id);
        list
    }

    /// A number for a session the catalog could not record.
    pub fn local_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Cancels the sessions `which` selects; returns those it cancelled (not those cancelled
    /// before).
    pub fn cancel(&self, which: qsm_catalog::coord::SessionsOf<'_>) -> Vec<Arc<Session>> {
        use qsm_catalog::coord::SessionsOf;
        let selected = |s: &Session| match which {
            SessionsOf::Id(id) => s.id == id,
            SessionsOf::Node(node) => s.node == Some(node),
            SessionsOf::Admin(name) => s.node.is_none() && s.account == name,
        };
        self.map()
            .values()
            .filter(|s| selected(s) && !s.cancelled.swap(true, Ordering::Relaxed))
            .cloned()
            .collect()
    }

    /// Removes sessions idle longer than `limit`, and those whose connection closed more than
    /// `grace` ago with no request since, returning them with how they ended.
    pub fn expire(&self, limit: Duration, grace: Duration) -> Vec<(Arc<Session>, &'static str)> {
        let mut map = self.map();
        let stale: Vec<(String, &'static str)> = map
            .iter()
            .filter_map(|(t, s)| {
                if s.orphaned_for().is_some_and(|d| d > grace) {
                    Some((t.clone(), "ended: its connection closed"))
                } else if s.idle() > limit {
                    Some((t.clone(), "expired"))
                } else {
                    None
                }
            })
            .collect();
        stale.into_iter().filter_map(|(t, how)| map.remove(&t).map(|s| (s, how))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_verify_only_against_their_own_hash() {
        let h = hash_password("correct horse").unwrap();
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(verify_password("correct horse", &h));
        assert!(!verify_password("correct hors", &h));
        assert!(!verify_password("", "!embedded"));
        assert_ne!(h, hash_password("correct horse").unwrap(), "salts must differ");
    }

    #[test]
    fn only_hashes_this_server_would_make_are_taken_from_a_replication_source() {
        assert!(acceptable_hash(&hash_password("a password").unwrap()));
        let costly = "$argon2id$v=19$m=4194304,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA";
        let slow = "$argon2id$v=19$m=19456,t=1000,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA";
        let other = "$argon2i$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA";
        for bad in [costly, slow, other, "plain", "!embedded", ""] {
            assert!(!acceptable_hash(bad), "{bad}");
        }
    }

    #[test]
    fn sessions_are_bounded_cancellable_and_expire() {
        let s = Sessions::default();
        let ids = AtomicU64::new(0);
        let new = |n: &str| NewSession {
            id: ids.fetch_add(1, Ordering::Relaxed) + 1,
            account: n.into(),
            node: Some(NodeId(1)),
            record: None,
            client: String::new(),
            peer: String::new(),
            conn: None,
        };
        let a = s.open(new("a"), "t1".into(), 2, 9).unwrap();
        s.open(new("b"), "t2".into(), 2, 9).unwrap();
        assert!(s.open(new("c"), "t3".into(), 2, 9).is_err(), "over the limit");
        use qsm_catalog::coord::SessionsOf;
        assert_eq!(s.cancel(SessionsOf::Id(a.id)).len(), 1);
        assert!(s.cancel(SessionsOf::Id(a.id)).is_empty(), "cancelled once");
        assert!(s.get("t1", None).unwrap().is_cancelled());
        assert!(s.cancel(SessionsOf::Id(999)).is_empty());
        s.open(new("c"), "t3".into(), 2, 9).expect("a cancelled session does not count");
        assert!(s.get("t1", None).is_some(), "kept while a request holds it");
        drop(a);
        assert!(s.open(new("d"), "t4".into(), 2, 9).is_err(), "b and c are open");
        assert!(s.get("t1", None).is_none(), "dropped once nothing holds it");
        assert_eq!(s.expire(Duration::from_secs(3600), Duration::ZERO).len(), 0);
        assert_eq!(s.expire(Duration::ZERO, Duration::ZERO).len(), 2);
        assert!(s.get("t2", None).is_none());
    }

    #[test]
    fn sessions_are_limited_per_node_and_end_when_their_connections_do() {
        let s = Sessions::default();
        let conns: Vec<Conn> =
            (0..10).map(|i| Conn::new(i, format!("10.0.0.1:{i}"), None)).collect();
        // A connection closes as `conns::Tracked` does: marked, and the sessions told if it
        // carried one.
        let close = |i: usize| {
            if conns[i].close() {
                s.orphan(conns[i].id);
            }
        };
        let new = |node: i64, conn: usize| NewSession {
            id: s.local_id(),
            account: format!("n{node}"),
            node: Some(NodeId(node)),
            record: None,
            client: String::new(),
            peer: conns[conn].peer.clone(),
            conn: Some(conns[conn].clone()),
        };
        s.open(new(1, 1), "a".into(), 10, 2).unwrap();
        s.open(new(1, 2), "b".into(), 10, 2).unwrap();
        let e = s.open(new(1, 3), "c".into(), 10, 2).unwrap_err();
        assert!(e.contains("node n1"), "{e}");
        s.open(new(2, 3), "c".into(), 10, 2).expect("another node");
        let ended = |s: &Sessions| -> Vec<String> {
            let ended = s.expire(Duration::from_secs(3600), Duration::ZERO);
            assert!(ended.iter().all(|(_, how)| *how == "ended: its connection closed"));
            ended.iter().map(|(s, _)| s.account.clone() + " " + &s.peer).collect()
        };
        // c's client reconnects (its channel's connection dropped): its requests come over
        // connection 4; then connection 3 closes, which leaves c alive.
        assert!(s.get("c", Some(&conns[4])).is_some());
        close(3);
        assert!(ended(&s).is_empty(), "c has connection 4");
        // Connections 1 and 2 close. A request of a's that was read before its connection
        // closed runs after: it does not reclaim a. One of b's over a new connection does.
        close(1);
        close(2);
        assert!(s.get("a", Some(&conns[1])).is_some());
        assert!(s.get("b", Some(&conns[9])).is_some(), "b is reclaimed by a request");
        assert_eq!(ended(&s), ["n1 10.0.0.1:1"]);
        assert!(s.get("a", Some(&conns[9])).is_none() && s.get("b", Some(&conns[9])).is_some());
        // A stream in progress keeps its session from idling, not from being orphaned: c's
        // last connection closes while its stream's messages are still being read.
        let c = s.get("c", Some(&conns[4])).unwrap();
        close(4);
        c.used();
        assert_eq!(ended(&s), ["n2 10.0.0.1:3"]);
        // A login read before its connection closed and run after starts orphaned.
        close(5);
        s.open(new(3, 5), "d".into(), 10, 2).unwrap();
        assert_eq!(ended(&s), ["n3 10.0.0.1:5"]);
        // The close lands between a request's look at the connection and its use of the
        // session: marked closed, but not yet reported (it carried nothing then). The
        // request's reclaim sees the mark, and the session is not kept alive by it.
        s.open(new(4, 7), "e".into(), 10, 2).unwrap();
        close(7);
        assert!(!conns[6].close(), "connection 6 carried no session: nothing to report");
        assert!(s.get("e", Some(&conns[6])).is_some());
        assert_eq!(ended(&s), ["n4 10.0.0.1:7"]);
        // Connection 9 closes: b, the last session over it, ends.
        close(9);
        assert_eq!(ended(&s), ["n1 10.0.0.1:2"]);
    }
}
