//! The change journal (TSM's journal-based backup): a daemon, `qsm journal start PATH...`,
//! watches trees with inotify (through `notify`) and records every path that changed in a
//! local SQLite database; `qsm backup` of a journaled tree then sends what the journal lists
//! instead of scanning millions of unchanged files.
//!
//! The journal replaces a scan only when it provably saw everything since the last backup:
//!
//! - the daemon is running now (it holds the lock `JOURNAL.lock`) and its watches were all in
//!   place before that backup ended (the backup recorded the daemon's journal id, a new
//!   random one each time the daemon starts watching a tree);
//! - nothing was lost (a full inotify queue, a watch that could not be added, a watched root
//!   that went away: the tree's journal is marked invalid, with the reason);
//! - the server's active inventory is the one that backup left (the filespace's generation,
//!   which the server renews at every change: another client, a catalog restore, an audit).
//!
//! Otherwise the backup scans, says why, and, if the daemon is running, makes the journal
//! valid for the next one. Changes are numbered: a backup removes only those numbered before
//! it started, so a file changed while the backup ran is sent by the next one.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use crate::{ClientError, Result};

/// One changed path below a journaled root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Below the root, `/`-separated, no leading `/` (empty for the root itself).
    pub rel: Vec<u8>,
    /// Everything below it may have changed too (a directory created or moved in): walk it.
    pub tree: bool,
}

/// What a backup of a root does with the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The journal is valid: send these, in path order.
    Journal { changes: Vec<Change>, mark: Mark },
    /// Scan, because of `why`; `mark` (when the daemon runs) makes the journal valid for the
    /// next backup once this one has committed.
    Scan { why: String, mark: Option<Mark> },
}

/// The journal's state at a backup's start, recorded when the backup has committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    journal_id: String,
    upto: i64,
}

/// The state of one journaled root, for `qsm journal status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootStatus {
    pub root: String,
    pub valid: bool,
    pub reason: String,
    pub since: i64,
    pub pending: u64,
}

/// The journal database.
#[derive(Debug)]
pub struct Journal {
    conn: Connection,
    path: PathBuf,
}

fn db_error(path: &Path, what: &str) -> impl FnOnce(rusqlite::Error) -> ClientError {
    let detail = format!("journal {}: {what}", path.display());
    let path = path.to_path_buf();
    move |e| match e.sqlite_error_code() {
        // Another file named as the journal: a mistake in how the command was given.
        Some(rusqlite::ErrorCode::NotADatabase) => ClientError::Usage(format!(
            "{} is not a QSM change journal (not an SQLite database)",
            path.display()
        )),
        _ => ClientError::Invalid(format!("{detail}: {e}")),
    }
}

/// What a backup's journal use is keyed on besides the journal itself: its include/exclude
/// patterns ([`crate::Filter::fingerprint`]) and the key it seals with, if any. A backup with
/// other patterns, or encryption turned on or its key replaced, scans: only a scan compares
/// every file with its active version (and sends again what another key, or none, sealed).
pub fn selection(filter: &crate::Filter, sealing_key: Option<&str>) -> String {
    match sealing_key {
        Some(key) => format!("{} sealed by {key}", filter.fingerprint()),
        None => filter.fingerprint(),
    }
}

/// The default journal: `$QSM_JOURNAL`, or `$XDG_STATE_HOME/qsm/journal.db`, or
/// `~/.local/state/qsm/journal.db`.
pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("QSM_JOURNAL") {
        return Some(PathBuf::from(p));
    }
    Some(crate::config::state_dir()?.join("journal.db"))
}

fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Whether a journal daemon is running on `path` now.
pub fn daemon_running(path: &Path) -> bool {
    match File::open(lock_path(path)) {
        Ok(f) => matches!(f.try_lock_shared(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

/// The generation recorded for a backup that skipped files: no filespace has it.
const RETRY: i64 = i64::MIN;

fn now() -> i64 {
    qsm_types::model::now()
}

fn new_id() -> Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| ClientError::Invalid(format!("no randomness: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Journal {
    /// Opens (creating) the journal database at `path`.
    pub fn open(path: &Path) -> Result<Journal> {
        crate::private::make_parent(path)?;
        // Created owner-only before SQLite opens it (its WAL and shared-memory files take the
        // database's mode): the journal lists the names of changed files.
        let _ = std::os::unix::fs::OpenOptionsExt::mode(
            std::fs::OpenOptions::new().write(true).create_new(true),
            0o600,
        )
        .open(path);
        let conn = Connection::open(path).map_err(db_error(path, "opening"))?;
        conn.busy_timeout(Duration::from_secs(30)).map_err(db_error(path, "opening"))?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             CREATE TABLE IF NOT EXISTS roots (root TEXT PRIMARY KEY, journal_id TEXT NOT NULL,
                 since BIGINT NOT NULL, valid BIGINT NOT NULL, reason TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS changes (root TEXT NOT NULL, rel BLOB NOT NULL,
                 tree BIGINT NOT NULL, seq BIGINT NOT NULL, PRIMARY KEY (root, rel));
             CREATE TABLE IF NOT EXISTS consumed (root TEXT NOT NULL, server TEXT NOT NULL,
                 journal_id TEXT NOT NULL, generation BIGINT NOT NULL, PRIMARY KEY (root, server));
             CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 1),
                 next BIGINT NOT NULL);
             INSERT OR IGNORE INTO counter (id, next) VALUES (1, 1);",
        )
        .map_err(db_error(path, "creating its tables"))?;
        // Journals made before backups recorded their patterns: '' matches no filter, so the
        // first backup after the upgrade scans.
        let has_patterns: bool = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('consumed') WHERE name = 'patterns'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)
            .map_err(db_error(path, "reading its tables"))?;
        if !has_patterns {
            conn.execute_batch("ALTER TABLE consumed ADD COLUMN patterns TEXT NOT NULL DEFAULT ''")
                .map_err(db_error(path, "upgrading its tables"))?;
        }
        Ok(Journal { conn, path: path.to_path_buf() })
    }

    /// Starts journaling `root` afresh (its watches are in place): a new journal id, valid,
    /// nothing pending. Backups made before it cannot use it.
    pub fn begin(&mut self, root: &str) -> Result<()> {
        let id = new_id()?;
        let t = self.conn.transaction().map_err(db_error(&self.path, "starting"))?;
        t.execute("DELETE FROM changes WHERE root = ?1", [root])
            .and_then(|_| {
                t.execute(
                    "INSERT INTO roots (root, journal_id, since, valid, reason) VALUES (?1, ?2, ?3, 1, '') \
                     ON CONFLICT (root) DO UPDATE SET journal_id = excluded.journal_id, since = excluded.since, valid = 1, reason = ''",
                    params![root, id, now()],
                )
            })
            .and_then(|_| t.commit())
            .map_err(db_error(&self.path, "starting a root"))
    }

    /// Records changes below `root`; a path already pending keeps its `tree` if set.
    pub fn record(&mut self, root: &str, changes: &[Change]) -> Result<()> {
        let t = self.conn.transaction().map_err(db_error(&self.path, "recording"))?;
        {
            // Numbers never go back, even once every change was consumed: a backup still
            // running with an older mark must not take a new change for one it saw.
            let seq: i64 = t
                .query_row("UPDATE counter SET next = next + 1 RETURNING next - 1", [], |r| {
                    r.get(0)
                })
                .map_err(db_error(&self.path, "recording"))?;
            let mut stmt = t
                .prepare_cached(
                    "INSERT INTO changes (root, rel, tree, seq) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (root, rel) DO UPDATE SET tree = max(tree, excluded.tree), seq = excluded.seq",
                )
                .map_err(db_error(&self.path, "recording"))?;
            for c in changes {
                stmt.execute(params![root, c.rel, i64::from(c.tree), seq])
                    .map_err(db_error(&self.path, "recording"))?;
            }
        }
        t.commit().map_err(db_error(&self.path, "recording"))
    }

    /// Marks `root`'s journal as no longer complete, with why: the next backup scans.
    pub fn invalidate(&mut self, root: &str, reason: &str) -> Result<()> {
        self.conn
            .execute(
                "UPDATE roots SET valid = 0, reason = ?2 WHERE root = ?1 AND valid = 1",
                params![root, reason],
            )
            .map(|_| ())
            .map_err(db_error(&self.path, "invalidating"))
    }

    /// What a backup of `root` to `server`, whose filespace is at `generation`, with the
    /// include/exclude patterns `patterns` ([`crate::filter::Filter::fingerprint`]), does.
    pub fn plan(&self, root: &str, server: &str, generation: i64, patterns: &str) -> Result<Plan> {
        let err = || db_error(&self.path, "reading");
        let state: Option<(String, bool, String)> = self
            .conn
            .query_row("SELECT journal_id, valid, reason FROM roots WHERE root = ?1", [root], |r| {
                Ok((r.get(0)?, r.get::<_, i64>(1)? != 0, r.get(2)?))
            })
            .optional()
            .map_err(err())?;
        let Some((journal_id, valid, reason)) = state else {
            return Ok(Plan::Scan {
                why: format!("{root} is not journaled (qsm journal start {root})"),
                mark: None,
            });
        };
        if !daemon_running(&self.path) {
            return Ok(Plan::Scan { why: "the journal daemon is not running".into(), mark: None });
        }
        if !valid {
            return Ok(Plan::Scan {
                why: format!("the journal is incomplete: {reason}"),
                mark: None,
            });
        }
        let upto: i64 = self
            .conn
            .query_row("SELECT COALESCE(MAX(seq), 0) FROM changes WHERE root = ?1", [root], |r| {
                r.get(0)
            })
            .map_err(err())?;
        let mark = Mark { journal_id: journal_id.clone(), upto };
        let consumed: Option<(String, i64, String)> = self
            .conn
            .query_row(
                "SELECT journal_id, generation, patterns FROM consumed WHERE root = ?1 AND server = ?2",
                params![root, server],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(err())?;
        let why = match consumed {
            None => "no backup was made while the journal ran".to_owned(),
            Some((_, RETRY, _)) => {
                "the last backup skipped files: scanning retries them".to_owned()
            }
            Some((id, _, _)) if id != journal_id => {
                "the journal daemon restarted since the last backup".to_owned()
            }
            Some((_, g, _)) if g != generation => {
                "the server's inventory changed since the last backup".to_owned()
            }
            // Changes the last backup's patterns skipped were consumed with it all the same;
            // entries those patterns excluded and these take (or the reverse) changed state
            // without any change the journal saw.
            Some((_, _, p)) if p != patterns => {
                "the include/exclude patterns differ from the last backup's, or the key it \
                 sealed with"
                    .to_owned()
            }
            Some(_) => {
                let mut stmt = self
                    .conn
                    .prepare(
                        "SELECT rel, tree FROM changes WHERE root = ?1 AND seq <= ?2 ORDER BY rel",
                    )
                    .map_err(err())?;
                let changes = stmt
                    .query_map(params![root, upto], |r| {
                        Ok(Change { rel: r.get(0)?, tree: r.get::<_, i64>(1)? != 0 })
                    })
                    .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                    .map_err(err())?;
                return Ok(Plan::Journal { changes, mark });
            }
        };
        Ok(Plan::Scan { why, mark: Some(mark) })
    }

    /// A backup of `root` to `server` that started at `mark` has committed, leaving the
    /// filespace at `generation`: the changes it saw are done, and the next backup may use
    /// the journal (if it is still the same, valid one).
    pub fn consumed(
        &mut self,
        root: &str,
        server: &str,
        mark: &Mark,
        generation: i64,
        patterns: &str,
    ) -> Result<()> {
        let t = self.conn.transaction().map_err(db_error(&self.path, "updating"))?;
        t.execute("DELETE FROM changes WHERE root = ?1 AND seq <= ?2", params![root, mark.upto])
            .and_then(|_| {
                t.execute(
                    "INSERT INTO consumed (root, server, journal_id, generation, patterns) VALUES (?1, ?2, ?3, ?4, ?5) \
                     ON CONFLICT (root, server) DO UPDATE SET journal_id = excluded.journal_id, generation = excluded.generation, patterns = excluded.patterns",
                    params![root, server, mark.journal_id, generation, patterns],
                )
            })
            .and_then(|_| t.commit())
            .map_err(db_error(&self.path, "updating"))
    }

    /// A backup of `root` to `server` that started at `mark` committed but skipped files
    /// (unreadable, changed while read): their changes must not be taken as done, so the
    /// next backup scans (and compares every file) instead of trusting the journal.
    pub fn skipped(&mut self, root: &str, server: &str, mark: &Mark) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO consumed (root, server, journal_id, generation) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (root, server) DO UPDATE SET journal_id = excluded.journal_id, generation = excluded.generation",
                params![root, server, mark.journal_id, RETRY],
            )
            .map(|_| ())
            .map_err(db_error(&self.path, "updating"))
    }

    /// A backup of a subtree of `root` to `server` committed and moved the filespace from
    /// generation `from` to `to`, with the patterns `patterns`. It consumed nothing (every
    /// change stays pending, and the next backup of `root` sends those below the subtree
    /// again), so the journal stays as trustworthy as it was: the last backup's record moves
    /// to `to`, but only if it was at `from` with the same patterns. Otherwise nothing changes
    /// and the next backup of `root` scans, as it would have.
    pub fn advanced(
        &mut self,
        root: &str,
        server: &str,
        from: i64,
        to: i64,
        patterns: &str,
    ) -> Result<()> {
        self.conn
            .execute(
                "UPDATE consumed SET generation = ?4 \
                 WHERE root = ?1 AND server = ?2 AND generation = ?3 AND patterns = ?5",
                params![root, server, from, to, patterns],
            )
            .map(|_| ())
            .map_err(db_error(&self.path, "updating"))
    }

    /// Whether `root` is journaled (a daemon watched it once, whatever its state now).
    pub fn journaled(&self, root: &str) -> Result<bool> {
        self.conn
            .query_row("SELECT 1 FROM roots WHERE root = ?1", [root], |_| Ok(()))
            .optional()
            .map(|row| row.is_some())
            .map_err(db_error(&self.path, "reading"))
    }

    /// The servers that backups of `root` consumed the journal for, with the filespace
    /// generation each backup left: what `plan` compares, for a status that cannot ask the
    /// servers themselves.
    pub fn consumers(&self, root: &str) -> Result<Vec<(String, i64)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT server, generation FROM consumed WHERE root = ?1 ORDER BY server")
            .map_err(db_error(&self.path, "reading"))?;
        stmt.query_map([root], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(db_error(&self.path, "reading"))
    }

    /// Every journaled root.
    pub fn status(&self) -> Result<Vec<RootStatus>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT r.root, r.valid, r.reason, r.since, \
                 (SELECT count(*) FROM changes c WHERE c.root = r.root) FROM roots r ORDER BY r.root",
            )
            .map_err(db_error(&self.path, "reading"))?;
        stmt.query_map([], |r| {
            Ok(RootStatus {
                root: r.get(0)?,
                valid: r.get::<_, i64>(1)? != 0,
                reason: r.get(2)?,
                since: r.get(3)?,
                pending: r.get::<_, i64>(4)? as u64,
            })
        })
        .and_then(|rows| rows.collect())
        .map_err(db_error(&self.path, "reading"))
    }
}

/// What one inotify event means for the journal of `root`: the changes, or `Err(reason)`
/// when events may have been lost.
fn changes_of(root: &Path, event: &notify::Event) -> std::result::Result<Vec<Change>, String> {
    use notify::EventKind;
    use notify::event::{ModifyKind, RenameMode};
    if event.need_rescan() {
        return Err("the kernel's event queue overflowed (fs.inotify.max_queued_events)".into());
    }
    let rel = |p: &Path| -> Option<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        p.strip_prefix(root).ok().map(|r| r.as_os_str().as_bytes().to_vec())
    };
    let parent = |r: &[u8]| -> Vec<u8> {
        r.iter().rposition(|b| *b == b'/').map(|i| r[..i].to_vec()).unwrap_or_default()
    };
    let mut out = Vec::new();
    // A name appearing (created, moved in) may be a directory whose contents the watch did not
    // see arrive: the whole subtree is walked. A name going or changing: itself. Either way
    // the parent directory's times changed.
    let (appears, named) = match &event.kind {
        EventKind::Access(_) => return Ok(out),
        EventKind::Create(_) => (true, true),
        EventKind::Modify(ModifyKind::Name(RenameMode::To)) => (true, true),
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
            for (i, p) in event.paths.iter().enumerate() {
                if let Some(r) = rel(p) {
                    out.push(Change { rel: parent(&r), tree: false });
                    out.push(Change { rel: r, tree: i == 1 });
                }
            }
            return Ok(out);
        }
        EventKind::Modify(ModifyKind::Name(_)) | EventKind::Remove(_) => (false, true),
        EventKind::Modify(_) => (false, false),
        // Anything else (an unknown kind): walk what it names.
        _ => (true, false),
    };
    for p in &event.paths {
        let Some(r) = rel(p) else { continue };
        if named && !r.is_empty() {
            out.push(Change { rel: parent(&r), tree: false });
        }
        out.push(Change { rel: r, tree: appears });
    }
    Ok(out)
}

/// Runs the journal daemon on `path` for `roots` until `stop` is set: watches each root
/// recursively, then records changes in batches. `ready` is called once every watch is in
/// place (backups from then on can use the journal).
pub fn run_daemon(
    path: &Path,
    roots: &[PathBuf],
    stop: &AtomicBool,
    ready: impl FnOnce(&[String]),
) -> Result<()> {
    use notify::{RecursiveMode, Watcher};
    let mut journal = Journal::open(path)?;
    // Owner-only like the journal beside it (the lock holds nothing, but nothing the client
    // writes is readable by others).
    let lock = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().create(true).truncate(false).write(true),
        0o600,
    )
    .open(lock_path(path))
    .map_err(ClientError::io("opening the lock of", path))?;
    if let Err(std::fs::TryLockError::WouldBlock) = lock.try_lock() {
        return Err(ClientError::Invalid(format!(
            "a journal daemon already runs on {}",
            path.display()
        )));
    }
    let mut names = Vec::new();
    for r in roots {
        names.push(crate::backup::filespace_name(r)?);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let mut watcher = notify::recommended_watcher(tx)
        .map_err(|e| ClientError::Invalid(format!("cannot start watching: {e}")))?;
    for (root, name) in roots.iter().zip(&names) {
        watcher.watch(Path::new(name), RecursiveMode::Recursive).map_err(|e| {
            ClientError::Invalid(format!(
                "cannot watch {}: {e} (a tree of many directories may need a larger fs.inotify.max_user_watches)",
                root.display()
            ))
        })?;
    }
    for name in &names {
        journal.begin(name)?;
    }
    ready(&names);
    let roots: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
    let mut pending: Vec<Vec<Change>> = vec![Vec::new(); roots.len()];
    let flush = |journal: &mut Journal, pending: &mut Vec<Vec<Change>>| -> Result<()> {
        for (i, changes) in pending.iter_mut().enumerate() {
            if !changes.is_empty() {
                journal.record(&names[i], changes)?;
                changes.clear();
            }
        }
        Ok(())
    };
    while !stop.load(Ordering::Relaxed) {
        // Batches of events, one transaction each: a burst of a million changes is not a
        // million commits.
        let deadline = std::time::Instant::now() + Duration::from_millis(200);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let event = match rx.recv_timeout(left) {
                Ok(e) => e,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    for name in &names {
                        journal.invalidate(name, "the watcher stopped")?;
                    }
                    return Err(ClientError::Invalid("the watcher stopped".into()));
                }
            };
            match event {
                Ok(event) => {
                    for (i, root) in roots.iter().enumerate() {
                        if !event.paths.iter().any(|p| p.starts_with(root)) && !event.need_rescan()
                        {
                            continue;
                        }
                        match changes_of(root, &event) {
                            Ok(c) => pending[i].extend(c),
                            Err(why) => journal.invalidate(&names[i], &why)?,
                        }
                        if event.paths.iter().any(|p| p == root)
                            && matches!(event.kind, notify::EventKind::Remove(_))
                        {
                            journal.invalidate(&names[i], "the journaled directory was removed")?;
                        }
                    }
                }
                Err(e) => {
                    // A watch that failed (too many directories, a permission): what happens
                    // below it is not seen.
                    let why = format!("a watch failed: {e}");
                    for name in &names {
                        journal.invalidate(name, &why)?;
                    }
                }
            }
        }
        flush(&mut journal, &mut pending)?;
    }
    flush(&mut journal, &mut pending)?;
    drop(watcher);
    drop(lock);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(rel: &str, tree: bool) -> Change {
        Change { rel: rel.as_bytes().to_vec(), tree }
    }

    #[test]
    fn a_journal_is_used_only_after_a_backup_made_while_it_ran_and_only_once() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("journal.db");
        let mut j = Journal::open(&path).unwrap();
        assert!(matches!(j.plan("/r", "s", 1, "p").unwrap(), Plan::Scan { mark: None, .. }));
        j.begin("/r").unwrap();
        // No daemon holds the lock: scan.
        let Plan::Scan { why, .. } = j.plan("/r", "s", 1, "p").unwrap() else { panic!() };
        assert!(why.contains("not running"), "{why}");
        let lock = File::create(lock_path(&path)).unwrap();
        lock.lock().unwrap();
        let Plan::Scan { why, mark: Some(mark) } = j.plan("/r", "s", 1, "p").unwrap() else {
            panic!()
        };
        assert!(why.contains("no backup"), "{why}");
        j.consumed("/r", "s", &mark, 7, "p").unwrap();
        j.record("/r", &[change("a", false), change("d", true)]).unwrap();
        j.record("/r", &[change("a", false), change("d", false)]).unwrap();
        let Plan::Journal { changes, mark } = j.plan("/r", "s", 7, "p").unwrap() else { panic!() };
        assert_eq!(changes, [change("a", false), change("d", true)]);
        // Changed while that backup ran: kept for the next one.
        j.record("/r", &[change("b", false)]).unwrap();
        j.consumed("/r", "s", &mark, 8, "p").unwrap();
        let Plan::Journal { changes, .. } = j.plan("/r", "s", 8, "p").unwrap() else { panic!() };
        assert_eq!(changes, [change("b", false)]);
        // Another server, the inventory changed, the journal lost events, a restart.
        assert!(matches!(j.plan("/r", "other", 8, "p").unwrap(), Plan::Scan { .. }));
        let Plan::Scan { why, .. } = j.plan("/r", "s", 9, "p").unwrap() else { panic!() };
        assert!(why.contains("inventory changed"), "{why}");
        j.invalidate("/r", "overflow").unwrap();
        let Plan::Scan { why, mark: None } = j.plan("/r", "s", 8, "p").unwrap() else { panic!() };
        assert!(why.contains("overflow"), "{why}");
        j.begin("/r").unwrap();
        let Plan::Scan { why, mark: Some(mark) } = j.plan("/r", "s", 8, "p").unwrap() else {
            panic!()
        };
        assert!(why.contains("restarted"), "{why}");
        // A backup that skipped files: the next one scans, then the journal serves again.
        j.record("/r", &[change("unreadable", false)]).unwrap();
        j.skipped("/r", "s", &mark).unwrap();
        let Plan::Scan { why, mark: Some(mark) } = j.plan("/r", "s", 8, "p").unwrap() else {
            panic!()
        };
        assert!(why.contains("skipped files"), "{why}");
        j.consumed("/r", "s", &mark, 9, "p").unwrap();
        assert!(matches!(j.plan("/r", "s", 9, "p").unwrap(), Plan::Journal { .. }));
        assert_eq!(j.status().unwrap()[0].pending, 0, "the skipped change was retried by the scan");
        // Issue 32: other patterns than the last backup's: scan, then the journal serves again.
        let Plan::Scan { why, mark: Some(mark) } = j.plan("/r", "s", 9, "q").unwrap() else {
            panic!()
        };
        assert!(why.contains("patterns differ"), "{why}");
        j.consumed("/r", "s", &mark, 9, "q").unwrap();
        assert!(matches!(j.plan("/r", "s", 9, "q").unwrap(), Plan::Journal { .. }));
        assert!(matches!(j.plan("/r", "s", 9, "p").unwrap(), Plan::Scan { .. }));
    }

    #[test]
    fn events_become_changes_of_the_path_and_its_parent() {
        use notify::event::{CreateKind, DataChange, ModifyKind, RemoveKind, RenameMode};
        use notify::{Event, EventKind};
        let root = Path::new("/r");
        let ev = |kind, paths: &[&str]| {
            let mut e = Event::new(kind);
            for p in paths {
                e = e.add_path(PathBuf::from(p));
            }
            e
        };
        let c = |kind, paths: &[&str]| changes_of(root, &ev(kind, paths)).unwrap();
        assert_eq!(
            c(EventKind::Create(CreateKind::Folder), &["/r/d/new"]),
            [change("d", false), change("d/new", true)]
        );
        assert_eq!(
            c(EventKind::Modify(ModifyKind::Data(DataChange::Any)), &["/r/f"]),
            [change("f", false)]
        );
        assert_eq!(
            c(EventKind::Remove(RemoveKind::File), &["/r/f"]),
            [change("", false), change("f", false)]
        );
        assert_eq!(
            c(EventKind::Modify(ModifyKind::Name(RenameMode::Both)), &["/r/a/x", "/r/b/y"]),
            [change("a", false), change("a/x", false), change("b", false), change("b/y", true)]
        );
        assert!(c(EventKind::Access(notify::event::AccessKind::Any), &["/r/f"]).is_empty());
        let overflow = ev(EventKind::Other, &[]).set_flag(notify::event::Flag::Rescan);
        assert!(changes_of(root, &overflow).is_err());
    }
}

/// What the next backup of a journaled root to one server will do.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NextBackup {
    /// The server, as backups record it (`Server::describe`).
    pub server: String,
    /// Whether it will send the journal's changes rather than scan.
    pub uses_journal: bool,
    /// The journal's changes it will send, if it uses the journal.
    pub changes: Option<usize>,
    /// Why it scans (or that it uses the journal).
    pub why: String,
}

/// A journaled root as `qsm journal status` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RootReport {
    pub root: String,
    /// Complete and kept by a running daemon.
    pub valid: bool,
    pub reason: String,
    pub since: i64,
    pub pending: u64,
    pub next_backup: Vec<NextBackup>,
}

/// The server a backup would use, as `describe`s it, with its filespaces; or why it could
/// not be asked.
pub type Asked = std::result::Result<(String, Vec<qsm_types::model::Filespace>), String>;

/// Every root of `j`, with what the next backup of each will do, as [`Journal::plan`] decides
/// it for that backup: with `asked`'s filespace generation when the server could be asked;
/// otherwise for each server a backup consumed the journal for, assuming its inventory is as
/// that backup left it (said in `why`). `running`: whether the daemon keeps the journal.
pub fn status_report(
    j: &Journal,
    running: bool,
    asked: Option<&Asked>,
    patterns: &str,
) -> Result<Vec<RootReport>> {
    let describe = |plan: Plan, server: String, assumed: Option<&str>| match plan {
        Plan::Journal { changes, .. } => NextBackup {
            server,
            uses_journal: true,
            changes: Some(changes.len()),
            why: match assumed {
                Some(a) => format!("the journal is valid, {a}"),
                None => "the journal is valid".into(),
            },
        },
        Plan::Scan { why, .. } => NextBackup { server, uses_journal: false, changes: None, why },
    };
    let mut all = Vec::new();
    for r in j.status()? {
        let mut next = Vec::new();
        match asked {
            Some(Ok((server, filespaces))) => match filespaces.iter().find(|f| f.name == r.root) {
                Some(f) => {
                    let plan = j.plan(&r.root, server, f.generation, patterns)?;
                    next.push(describe(plan, server.clone(), None));
                }
                None => next.push(NextBackup {
                    server: server.clone(),
                    uses_journal: false,
                    changes: None,
                    why: format!("{} was never backed up there", r.root),
                }),
            },
            _ => {
                let cannot = match asked {
                    Some(Err(e)) => format!("if its inventory is unchanged (cannot ask: {e})"),
                    _ => "if its inventory is unchanged (no server or store to ask)".into(),
                };
                let consumers = j.consumers(&r.root)?;
                if consumers.is_empty() {
                    let plan = j.plan(&r.root, "", 0, patterns)?;
                    next.push(describe(plan, "any server".into(), None));
                }
                for (server, generation) in consumers {
                    let plan = j.plan(&r.root, &server, generation, patterns)?;
                    next.push(describe(plan, server, Some(&cannot)));
                }
            }
        }
        all.push(RootReport {
            valid: r.valid && running,
            reason: if running { r.reason } else { "the journal daemon is not running".into() },
            root: r.root,
            since: r.since,
            pending: r.pending,
            next_backup: next,
        });
    }
    Ok(all)
}
