//! The crash test of the commit protocol: a child process backs up, deletes and reclaims in a
//! loop and is killed with SIGKILL at a random instant; after each kill, the store must pass
//! the full consistency check (catalog invariants, and every referenced chunk readable with a
//! valid checksum) and every version the child reported committed must restore intact.
//!
//! The child is this test binary, re-run with `QSM_KILL9_DIR` set on its ignored test
//! `kill9_child`. It prints `C <id> <xxh3> <len>` after each committed object, `d <id>` before
//! deleting one and `D <id>` after the delete committed. 200 trials by default; set
//! `QSM_KILL9_TRIALS` for a longer run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use qsm_catalog::ObjectId;
use qsm_store::TxnLimits;
use xxhash_rust::xxh3::xxh3_64;

const DIR_ENV: &str = "QSM_KILL9_DIR";
const SEED_ENV: &str = "QSM_KILL9_SEED";
/// Trials share a store for this many kills (so recovery from earlier crashes is exercised),
/// then start afresh (so verification stays fast).
const TRIALS_PER_STORE: u32 = 25;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The child: writes, deletes and reclaims until killed.
#[test]
#[ignore = "run by kill9_loses_nothing_committed as a child process"]
fn kill9_child() {
    let Ok(dir) = std::env::var(DIR_ENV) else { return };
    let seed: u64 = std::env::var(SEED_ENV).ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (store, fs) = common::open_store(std::path::Path::new(&dir), Some(256 * 1024));
    let out = std::io::stdout();
    store.remove_orphans().unwrap();
    let mut mine: Vec<ObjectId> = Vec::new();
    for round in 0u64.. {
        if round % 4 == 3 && !mine.is_empty() {
            let mut t = store.catalog().begin().unwrap();
            let mut doomed = Vec::new();
            for _ in 0..rng.below(3) + 1 {
                let id = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                writeln!(out.lock(), "d {}", id.0).unwrap();
                t.delete_object(id, qsm_catalog::model::now()).unwrap();
                doomed.push(id);
                if mine.is_empty() {
                    break;
                }
            }
            t.commit().unwrap();
            for id in doomed {
                writeln!(out.lock(), "D {}", id.0).unwrap();
            }
            store.reclaim(0.6).unwrap();
            continue;
        }
        let mut batch = store.batch(TxnLimits { group_max: 3, byte_limit: 200_000 }).unwrap();
        let mut added = Vec::new();
        for j in 0..rng.below(5) + 1 {
            let bytes = common::data(rng.below(60_000) as usize + 1, rng.next());
            let frames = common::frames(&bytes, 16 * 1024);
            let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
            let path = format!("/s{seed}/r{round}/f{j}");
            if let Some(c) = batch.add(common::object(fs, &path, bytes.len()), &refs, 1).unwrap() {
                report(&out, &c.objects, &mut added, &mut mine);
            }
            added.push((xxh3_64(&bytes), bytes.len()));
        }
        let c = batch.finish(1).unwrap();
        report(&out, &c.objects, &mut added, &mut mine);
    }
}

fn report(
    out: &std::io::Stdout,
    ids: &[ObjectId],
    added: &mut Vec<(u64, usize)>,
    mine: &mut Vec<ObjectId>,
) {
    let mut lock = out.lock();
    for (id, (hash, len)) in ids.iter().zip(added.drain(..ids.len())) {
        writeln!(lock, "C {} {hash} {len}", id.0).unwrap();
        mine.push(*id);
    }
    lock.flush().unwrap();
}

#[test]
fn kill9_loses_nothing_committed() {
    let trials: u32 =
        std::env::var("QSM_KILL9_TRIALS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let exe = std::env::current_exe().unwrap();
    let mut rng = Rng(0x5eed_1234);
    let (mut checked_objects, mut kills_with_progress) = (0usize, 0u32);
    let mut tmp = None;
    let mut committed: HashMap<i64, (u64, usize)> = HashMap::new();
    let mut deleted: HashSet<i64> = HashSet::new();
    for trial in 0..trials {
        if trial % TRIALS_PER_STORE == 0 {
            let dir = tempfile::TempDir::new().unwrap();
            drop(common::open_store(dir.path(), Some(256 * 1024))); // created before any kill
            tmp = Some(dir);
            committed.clear();
            deleted.clear();
        }
        let dir = tmp.as_ref().unwrap().path();
        let mut child = Command::new(&exe)
            .args(["kill9_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(DIR_ENV, dir)
            .env(SEED_ENV, trial.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<String>>()
        });
        // Kill at a random instant: from before the store is open to well into the loop.
        std::thread::sleep(Duration::from_millis(10 + rng.below(140)));
        let alive = matches!(child.try_wait(), Ok(None));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        let lines = reader.join().unwrap();
        if !alive {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
            panic!("trial {trial}: the child exited by itself ({status}) before the kill:\n{err}");
        }
        let mut maybe_deleted = HashSet::new();
        for line in &lines {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["C", id, hash, len] => {
                    committed
                        .insert(id.parse().unwrap(), (hash.parse().unwrap(), len.parse().unwrap()));
                }
                ["d", id] => {
                    maybe_deleted.insert(id.parse::<i64>().unwrap());
                }
                ["D", id] => {
                    let id = id.parse().unwrap();
                    maybe_deleted.remove(&id);
                    committed.remove(&id);
                    deleted.insert(id);
                }
                _ => {}
            }
        }
        kills_with_progress += u32::from(lines.iter().any(|l| l.starts_with('C')));

        // Recovery: reopen, check everything, restore everything known committed.
        let started = Instant::now();
        let (store, _) = common::open_store(dir, Some(256 * 1024));
        let report = store.check().unwrap();
        assert!(
            report.problems.is_empty(),
            "trial {trial}: inconsistent after SIGKILL: {:#?}",
            report.problems
        );
        for (id, (hash, len)) in &committed {
            if maybe_deleted.contains(id) {
                continue;
            }
            let mut out = Vec::new();
            store
                .restore(ObjectId(*id), &mut out)
                .unwrap_or_else(|e| panic!("trial {trial}: committed object {id} lost: {e}"));
            assert_eq!(
                (xxh3_64(&out), out.len()),
                (*hash, *len),
                "trial {trial}: object {id} restored wrong"
            );
            checked_objects += 1;
        }
        for id in &deleted {
            assert!(
                store.catalog().object(ObjectId(*id)).unwrap().is_none(),
                "trial {trial}: deleted object {id} is back"
            );
        }
        // Deletions the child started but may not have committed are now known either way.
        for id in maybe_deleted {
            if store.catalog().object(ObjectId(id)).unwrap().is_none() {
                committed.remove(&id);
                deleted.insert(id);
            }
        }
        assert!(started.elapsed() < Duration::from_secs(30), "recovery took too long");
    }
    // The test means something only if kills landed mid-work, not all before the first commit.
    assert!(
        kills_with_progress >= trials / 4,
        "only {kills_with_progress} of {trials} kills came after a commit"
    );
    eprintln!(
        "kill9: {trials} kills, {kills_with_progress} after commits, {checked_objects} object restores verified"
    );
}
