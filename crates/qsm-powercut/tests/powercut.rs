//! The forgetful file system against its model: each test mounts it over a fresh
//! directory, does something through the mount, reboots, and reads the backing dir.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use qsm_powercut::{Fault, Forgetful, Op, unavailable};
use tempfile::TempDir;

struct Rig {
    _dir: TempDir,
    backing: PathBuf,
    mnt: PathBuf,
}

/// A fresh backing dir and mountpoint, or `None` (after saying why) when this machine
/// cannot mount FUSE and QSM_TEST_REQUIRE_ROOT is not 1.
fn rig() -> Option<Rig> {
    if let Some(why) = unavailable() {
        if std::env::var("QSM_TEST_REQUIRE_ROOT").as_deref() == Ok("1") {
            panic!("QSM_TEST_REQUIRE_ROOT=1 but {why}");
        }
        eprintln!("skipping: {why}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    Some(Rig { _dir: dir, backing, mnt })
}

impl Rig {
    fn mount(&self) -> Forgetful {
        Forgetful::mount(&self.backing, &self.mnt).unwrap()
    }
    fn m(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }
    fn b(&self, name: &str) -> PathBuf {
        self.backing.join(name)
    }
}

fn sync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

fn rw(path: &Path) -> File {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn synced_write_survives() {
    let Some(r) = rig() else { return };
    let fs = r.mount();
    let f = rw(&r.m("a"));
    f.write_all_at(b"durable", 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    sync_dir(&r.mnt);
    let lost = fs.reboot().unwrap();
    assert_eq!(fs::read(r.b("a")).unwrap(), b"durable");
    assert_eq!(lost.writes, 0);
    assert_eq!(lost.namespace_ops, 0);
    assert!(!r.b(".qsm-powercut-stash").exists());
}

#[test]
fn unsynced_write_is_gone() {
    let Some(r) = rig() else { return };
    fs::write(r.b("old"), b"before").unwrap();
    let fs = r.mount();
    // A new file whose name is durable but whose data is not.
    let f = rw(&r.m("new"));
    f.write_all_at(b"never synced", 0).unwrap();
    drop(f);
    sync_dir(&r.mnt);
    // Appending to a durable file without a sync.
    let mut f = OpenOptions::new().append(true).open(r.m("old")).unwrap();
    f.write_all(b" and after").unwrap();
    drop(f);
    assert_eq!(fs::read(r.m("old")).unwrap(), b"before and after");
    let lost = fs.reboot().unwrap();
    assert_eq!(fs::read(r.b("new")).unwrap(), b"");
    assert_eq!(fs::read(r.b("old")).unwrap(), b"before");
    assert_eq!(lost.writes, 2);
    assert_eq!(lost.bytes, 22);
}

#[test]
fn created_file_without_dir_sync_is_gone() {
    let Some(r) = rig() else { return };
    let fs = r.mount();
    fs::create_dir(r.m("sub")).unwrap();
    sync_dir(&r.mnt); // "sub" is durable, what goes in it is not
    let f = rw(&r.m("sub/file"));
    f.write_all_at(b"synced data, unsynced name", 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::create_dir(r.m("sub/dir")).unwrap();
    std::os::unix::fs::symlink("file", r.m("sub/link")).unwrap();
    let lost = fs.reboot().unwrap();
    assert!(r.b("sub").is_dir());
    assert_eq!(fs::read_dir(r.b("sub")).unwrap().count(), 0);
    assert_eq!(lost.namespace_ops, 3);
}

#[test]
fn rename_without_dir_sync_reverts_and_brings_back_the_target() {
    let Some(r) = rig() else { return };
    fs::create_dir(r.b("d")).unwrap();
    fs::write(r.b("a"), b"A").unwrap();
    fs::write(r.b("d/b"), b"B").unwrap();
    let fs = r.mount();
    fs::rename(r.m("a"), r.m("d/b")).unwrap();
    assert_eq!(fs::read(r.m("d/b")).unwrap(), b"A");
    assert!(!r.m("a").exists());
    sync_dir(&r.m("d")); // one parent is not enough
    let lost = fs.reboot().unwrap();
    assert_eq!(fs::read(r.b("a")).unwrap(), b"A");
    assert_eq!(fs::read(r.b("d/b")).unwrap(), b"B");
    assert_eq!(lost.namespace_ops, 1);

    // Both parents synced: the rename holds.
    let fs = r.mount();
    fs::rename(r.m("a"), r.m("d/b")).unwrap();
    sync_dir(&r.m("d"));
    sync_dir(&r.mnt);
    fs.reboot().unwrap();
    assert!(!r.b("a").exists());
    assert_eq!(fs::read(r.b("d/b")).unwrap(), b"A");
}

#[test]
fn rename_of_a_directory_then_unsynced_work_inside_it() {
    let Some(r) = rig() else { return };
    let fs = r.mount();
    fs::create_dir(r.m("x")).unwrap();
    fs::rename(r.m("x"), r.m("y")).unwrap();
    sync_dir(&r.mnt); // mkdir and rename are durable
    fs::write(r.m("y/f"), b"f").unwrap(); // not durable: y not synced
    fs::rename(r.m("y"), r.m("z")).unwrap(); // not durable
    fs.reboot().unwrap();
    assert!(r.b("y").is_dir());
    assert!(!r.b("x").exists() && !r.b("z").exists());
    assert_eq!(fs::read_dir(r.b("y")).unwrap().count(), 0);
}

#[test]
fn unlink_without_dir_sync_reverts() {
    let Some(r) = rig() else { return };
    fs::write(r.b("keep"), b"K").unwrap();
    fs::write(r.b("gone"), b"G").unwrap();
    fs::create_dir(r.b("emptydir")).unwrap();
    let fs = r.mount();
    fs::remove_file(r.m("keep")).unwrap();
    fs::remove_dir(r.m("emptydir")).unwrap();
    assert!(!r.m("keep").exists());
    // The stash is not visible through the mount.
    let names: Vec<_> = fs::read_dir(&r.mnt).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec!["gone"]);
    let lost = fs.reboot().unwrap();
    assert_eq!(fs::read(r.b("keep")).unwrap(), b"K");
    assert!(r.b("emptydir").is_dir());
    assert_eq!(lost.namespace_ops, 2);

    let fs = r.mount();
    fs::remove_file(r.m("gone")).unwrap();
    sync_dir(&r.mnt);
    fs.reboot().unwrap();
    assert!(!r.b("gone").exists());
    assert!(r.b("keep").exists());
}

#[test]
fn link_without_dir_sync_reverts() {
    let Some(r) = rig() else { return };
    fs::write(r.b("orig"), b"O").unwrap();
    let fs = r.mount();
    fs::hard_link(r.m("orig"), r.m("second")).unwrap();
    fs::remove_file(r.m("orig")).unwrap();
    assert_eq!(fs::read(r.m("second")).unwrap(), b"O");
    let lost = fs.reboot().unwrap();
    assert_eq!(lost.namespace_ops, 2);
    assert_eq!(fs::read(r.b("orig")).unwrap(), b"O");
    assert!(!r.b("second").exists());
}

#[test]
fn unlinked_open_file_keeps_working() {
    let Some(r) = rig() else { return };
    let fs = r.mount();
    let f = rw(&r.m("tmp"));
    fs::remove_file(r.m("tmp")).unwrap();
    f.write_all_at(b"still here", 0).unwrap();
    let mut back = String::new();
    (&f).read_to_string(&mut back).unwrap();
    assert_eq!(back, "still here");
    drop(f);
    fs.reboot().unwrap();
    assert!(!r.b("tmp").exists());
}

#[test]
fn truncate_reverts() {
    let Some(r) = rig() else { return };
    let data = pattern(10_000, 1);
    fs::write(r.b("t"), &data).unwrap();
    fs::write(r.b("grow"), b"small").unwrap();
    let fs = r.mount();
    OpenOptions::new().write(true).open(r.m("t")).unwrap().set_len(100).unwrap();
    let f = OpenOptions::new().write(true).open(r.m("grow")).unwrap();
    f.set_len(9000).unwrap();
    f.write_all_at(b"X", 8000).unwrap();
    drop(f);
    assert_eq!(fs::metadata(r.m("t")).unwrap().len(), 100);
    let lost = fs.reboot().unwrap();
    assert_eq!(fs::read(r.b("t")).unwrap(), data);
    assert_eq!(fs::read(r.b("grow")).unwrap(), b"small");
    assert_eq!(lost.writes, 3);
}

#[test]
fn overwrite_of_durable_data_reverts_to_the_old_bytes() {
    let Some(r) = rig() else { return };
    let old = pattern(5 * 4096 + 123, 7);
    fs::write(r.b("o"), &old).unwrap();
    let fs = r.mount();
    let f = OpenOptions::new().read(true).write(true).open(r.m("o")).unwrap();
    f.write_all_at(&[0xAA; 6000], 3000).unwrap(); // across pages 0..=2
    f.write_all_at(&[0xBB; 100], 4000).unwrap(); // page 0 again, already saved
    f.write_all_at(&[0xCC; 9000], old.len() as u64 - 50).unwrap(); // over the end
    let mut now = vec![0; 3000 + 6000];
    f.read_exact_at(&mut now, 0).unwrap();
    assert_eq!(&now[..3000], &old[..3000]);
    assert_eq!(now[4050], 0xBB);
    drop(f);
    fs.reboot().unwrap();
    assert_eq!(fs::read(r.b("o")).unwrap(), old);
}

#[test]
fn tearing_keeps_a_page_aligned_prefix_of_the_last_write() {
    let Some(r) = rig() else { return };
    fs::write(r.b("w"), b"").unwrap();
    let fs = r.mount();
    fs.set_tear(true);
    let f = rw(&r.m("w"));
    f.write_all_at(b"early", 0).unwrap();
    let last = pattern(3 * 4096 + 100, 3);
    f.write_all_at(&last, 1000).unwrap(); // boundaries at 4096, 8192, 12288
    drop(f);
    let lost = fs.reboot().unwrap();
    let torn = lost.torn.expect("the last write is torn");
    assert_eq!((torn.offset, torn.len, torn.kept), (1000, last.len() as u64, 12288 - 1000));
    let after = fs::read(r.b("w")).unwrap();
    assert_eq!(after.len(), 12288);
    assert_eq!(&after[..1000], &[0; 1000][..], "the earlier write is dropped");
    assert_eq!(&after[1000..], &last[..12288 - 1000]);
}

#[test]
fn cut_at_sync_fails_that_sync_and_everything_after() {
    let Some(r) = rig() else { return };
    fs::write(r.b("c"), b"").unwrap();
    let fs = r.mount();
    let before = fs.syncs();
    fs.cut_at_sync(2);
    let f = rw(&r.m("c"));
    f.write_all_at(b"one", 0).unwrap();
    f.sync_all().unwrap();
    assert!(!fs.is_cut());
    f.write_all_at(b"two", 3).unwrap();
    let err = f.sync_data().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(fs.is_cut());
    assert_eq!(fs.syncs(), before + 2);
    let eio = |e: io::Error| assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    eio(f.write_all_at(b"three", 6).unwrap_err());
    // An open file still reads (a mapped file must not fault); nothing opens any more.
    let mut back = [0; 3];
    f.read_at(&mut back, 0).unwrap();
    assert_eq!(&back, b"one");
    eio(File::open(r.m("c")).and_then(|mut f| f.read(&mut [0; 1])).unwrap_err());
    eio(fs::create_dir(r.m("nope")).unwrap_err());
    drop(f);
    fs.reboot().unwrap();
    assert_eq!(fs::read(r.b("c")).unwrap(), b"one");
    assert!(!r.b("nope").exists());
}

#[test]
fn failed_fsync_loses_the_data_even_after_a_later_successful_fsync() {
    let Some(r) = rig() else { return };
    let old = pattern(3 * 4096, 9);
    fs::write(r.b("g"), &old).unwrap();
    let fs = r.mount();
    fs.inject(Fault { op: Op::Sync, errno: libc::EIO, path_contains: Some("g".into()), nth: 1 });
    let f = OpenOptions::new().read(true).write(true).open(r.m("g")).unwrap();
    f.write_all_at(&[1; 4096], 0).unwrap();
    f.write_all_at(&[2; 4096], 4096).unwrap();
    f.write_all_at(&[3; 100], 3 * 4096).unwrap(); // grows the file
    assert_eq!(f.sync_all().unwrap_err().raw_os_error(), Some(libc::EIO));
    f.sync_all().unwrap(); // "retrying" fsync succeeds and means nothing
    f.write_all_at(&[4; 4096], 4096).unwrap(); // the page is written again: it counts
    f.write_all_at(&[5; 10], 2 * 4096).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let lost = fs.reboot().unwrap();
    let after = fs::read(r.b("g")).unwrap();
    assert_eq!(after.len(), 3 * 4096 + 100, "the size at the failure is kept");
    assert_eq!(&after[..4096], &old[..4096], "lost to the failed sync");
    assert_eq!(&after[4096..8192], &[4; 4096][..], "rewritten and synced");
    assert_eq!(&after[8192..8202], &[5; 10][..]);
    assert_eq!(&after[8202..12288], &old[8202..12288]);
    assert_eq!(&after[12288..], &[0; 100][..], "grown bytes lost to the failed sync");
    assert_eq!(lost.writes, 3);
}

#[test]
fn injected_errors_reach_the_caller_once() {
    let Some(r) = rig() else { return };
    fs::write(r.b("x.dat"), b"0123456789").unwrap();
    let fs = r.mount();
    let f = OpenOptions::new().read(true).write(true).open(r.m("x.dat")).unwrap();
    let enospc =
        Fault { op: Op::Write, errno: libc::ENOSPC, path_contains: Some(".dat".into()), nth: 2 };
    fs.inject(enospc);
    fs.inject(Fault { op: Op::Read, errno: libc::EIO, path_contains: None, nth: 1 });
    fs.inject(Fault {
        op: Op::Write,
        errno: libc::EIO,
        path_contains: Some("other".into()),
        nth: 1,
    });
    f.write_all_at(b"a", 0).unwrap();
    let err = f.write_all_at(b"b", 1).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    f.write_all_at(b"c", 2).unwrap();
    let err = f.read_at(&mut [0; 4], 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    let mut back = [0; 4];
    f.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(&back, b"a1c3", "the failed write changed nothing");
    assert!(!fs.is_cut());
}

fn mounted(mnt: &Path) -> bool {
    let mnt = mnt.canonicalize().unwrap();
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap()))
}

#[test]
fn drop_unmounts_without_reverting() {
    let Some(r) = rig() else { return };
    let fs = r.mount();
    assert!(mounted(&r.mnt));
    fs::write(r.m("f"), b"unsynced").unwrap();
    drop(fs);
    assert!(!mounted(&r.mnt));
    assert_eq!(fs::read(r.b("f")).unwrap(), b"unsynced");
}

#[test]
fn reboot_with_a_descriptor_left_open() {
    let Some(r) = rig() else { return };
    fs::write(r.b("f"), b"old").unwrap();
    let fs = r.mount();
    let f = OpenOptions::new().read(true).write(true).open(r.m("f")).unwrap();
    f.write_all_at(b"new", 0).unwrap();
    fs.reboot().unwrap();
    assert!(!mounted(&r.mnt));
    assert_eq!(fs::read(r.b("f")).unwrap(), b"old");
    assert!(f.write_all_at(b"late", 0).is_err());
    drop(f);
    assert_eq!(fs::read(r.b("f")).unwrap(), b"old");
}

mod sqlite {
    use super::*;
    use rusqlite::Connection;

    const COMMITS: usize = 8;

    /// Commits rows one transaction at a time, with a checkpoint half-way; returns how
    /// many commits reported success before the first error.
    fn scenario(db: &Path) -> usize {
        let Ok(mut conn) = Connection::open(db) else { return 0 };
        let mut done = 0;
        let _ = commit_rows(&mut conn, &mut done);
        let _ = conn.close(); // after a cut this fails; the connection is gone either way
        done
    }

    fn commit_rows(conn: &mut Connection, done: &mut usize) -> rusqlite::Result<()> {
        conn.pragma_update(None, "synchronous", "FULL")?;
        for i in 0..COMMITS {
            let tx = conn.transaction()?;
            let row = format!("row {i} {}", "x".repeat(3000));
            tx.execute("INSERT INTO t (v) VALUES (?1)", [row])?;
            tx.commit()?;
            *done += 1;
            if i == COMMITS / 2 {
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            }
        }
        Ok(())
    }

    fn setup(backing: &Path) {
        let conn = Connection::open(backing.join("cat.db")).unwrap();
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)").unwrap();
        conn.close().unwrap();
    }

    fn check(backing: &Path) -> (usize, String) {
        let conn = Connection::open(backing.join("cat.db")).unwrap();
        let ok: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        let n: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        (usize::try_from(n).unwrap(), ok)
    }

    #[test]
    fn wal_commits_survive_a_cut_at_every_sync() {
        let Some(r) = rig() else { return };
        setup(&r.backing);
        let pristine = r._dir.path().join("pristine");
        fs::create_dir(&pristine).unwrap();
        fs::copy(r.b("cat.db"), pristine.join("cat.db")).unwrap();
        // A dry run counts the scenario's syncs.
        let fs = r.mount();
        assert_eq!(scenario(&r.m("cat.db")), COMMITS);
        let syncs = fs.syncs();
        fs.reboot().unwrap();
        assert_eq!(check(&r.backing), (COMMITS, "ok".into()));
        assert!(syncs >= COMMITS as u64, "each commit syncs the WAL: {syncs}");

        eprintln!("scenario: {syncs} syncs");
        let mut lost_rows = 0;
        for cut in 1..=syncs + 1 {
            fs::remove_dir_all(&r.backing).unwrap();
            fs::create_dir(&r.backing).unwrap();
            fs::copy(pristine.join("cat.db"), r.b("cat.db")).unwrap();
            let fs = r.mount();
            fs.cut_at_sync(cut);
            fs.set_tear(cut % 2 == 0);
            let committed = scenario(&r.m("cat.db"));
            fs.reboot().unwrap();
            let (rows, ok) = check(&r.backing);
            assert_eq!(ok, "ok", "cut at sync {cut}");
            assert!(
                committed <= rows && rows <= committed + 1,
                "cut at sync {cut}: {committed} commits reported, {rows} rows found"
            );
            if cut > syncs {
                assert_eq!(rows, COMMITS);
            }
            lost_rows += COMMITS - rows;
        }
        assert!(lost_rows > 0, "no trial lost anything: the cuts did nothing");
    }
}
