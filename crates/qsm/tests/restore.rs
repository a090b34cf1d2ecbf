//! End-to-end tests of what a restore may and may not do, on the real `qsm` binary (issue 22):
//! a server that withholds, repeats, reorders or cuts short a file's frames fails that file by
//! name, over the real protocol, and the others come back; the target and the directories
//! around what was asked keep their metadata; leftovers of killed restores are removed;
//! restores of nothing, or where everything failed, exit 1; names need not be UTF-8.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use predicates::prelude::*;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command as StdCommand;

use assert_cmd::Command;
use qsm_proto::v1;
use qsm_proto::v1::node_client::NodeClient;
use qsm_proto::v1::node_server::{Node, NodeServer};
use tempfile::TempDir;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

include!("suite/noise.rs");

include!("suite/plain_server.rs");

/// A node registered on `server`, and a client command for it at `url` (the server itself,
/// or a faulty server in front of it).
struct NodeLogin {
    pw: PathBuf,
}

impl NodeLogin {
    fn register(server: &ServerProc, dir: &Path) -> NodeLogin {
        Command::cargo_bin("qsm")
            .unwrap()
            .arg("admin")
            .arg("--server")
            .arg(format!("unix:{}", server.data.join("qsm.sock").display()))
            .args(["register-node", "alpha"])
            .write_stdin("alpha-password\n")
            .assert()
            .success();
        let pw = dir.join("pw");
        fs::write(&pw, "alpha-password\n").unwrap();
        fs::set_permissions(&pw, fs::Permissions::from_mode(0o600)).unwrap();
        NodeLogin { pw }
    }

    fn client(&self, url: &str, home: &Path) -> Command {
        let mut c = Command::cargo_bin("qsm").unwrap();
        c.env("QSM_SERVER", url)
            .env("QSM_NODE", "alpha")
            .env("QSM_PASSWORD_FILE", &self.pw)
            .env("QSM_HOME", "/nonexistent/embedded-must-not-be-used")
            .env("HOME", home);
        c
    }
}

/// What the faulty server does to the frames of the file it picks (the one with the most
/// frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Drops its second frame.
    Withhold,
    /// Sends its second frame twice.
    Duplicate,
    /// Swaps its second and third frames.
    Reorder,
    /// Marks its second frame last, and sends the rest after it anyway.
    LastEarly,
    /// Marks its second frame last and sends nothing more of it: the file ends early.
    Truncate,
    /// Sends its second frame's place without its data.
    NoData,
    /// Sends one more frame past its end (a copy of its last, at the next offset).
    PastEnd,
    /// Sends its last frame again after it.
    AfterLast,
    /// Ends the whole stream after its second frame.
    Cut,
    /// Sends nothing of it after its second frame, not even `last`, and goes on with the
    /// next file.
    Skip,
    /// Sends a frame of an object nobody asked for among its frames.
    Foreign,
}

impl Fault {
    /// `frames` as this fault sends them.
    fn mangle(self, mut frames: Vec<v1::Frame>) -> Vec<v1::Frame> {
        let mut counts = std::collections::HashMap::new();
        for f in &frames {
            *counts.entry(f.object).or_insert(0) += 1;
        }
        let (&victim, &n) = counts.iter().max_by_key(|(_, n)| **n).unwrap();
        assert!(n >= 4, "the victim has {n} frames, the faults need 4");
        let at: Vec<usize> = (0..frames.len()).filter(|&i| frames[i].object == victim).collect();
        let (second, third, last) = (at[1], at[2], at[at.len() - 1]);
        match self {
            Fault::Withhold => {
                frames.remove(second);
            }
            Fault::Duplicate => {
                let f = frames[second].clone();
                frames.insert(second + 1, f);
            }
            Fault::Reorder => frames.swap(second, third),
            Fault::LastEarly => frames[second].last = true,
            Fault::Truncate => {
                frames[second].last = true;
                for &i in at[2..].iter().rev() {
                    frames.remove(i);
                }
            }
            Fault::NoData => frames[second].data.clear(),
            Fault::PastEnd => {
                let mut extra = frames[last].clone();
                extra.offset += u64::from(extra.raw_len);
                frames[last].last = false;
                frames.insert(last + 1, extra);
            }
            Fault::AfterLast => {
                let f = frames[last].clone();
                frames.insert(last + 1, f);
            }
            Fault::Cut => frames.truncate(second + 1),
            Fault::Skip => {
                assert!(last + 1 < frames.len(), "the victim must not be the last object");
                for &i in at[2..].iter().rev() {
                    frames.remove(i);
                }
            }
            Fault::Foreign => {
                let mut f = frames[second].clone();
                f.object = 999_999_999;
                frames.insert(second, f);
            }
        }
        frames
    }
}

/// A node service that passes every call to the real server, except that it mangles the
/// frames of restores ([`Fault`]) and takes no backups.
struct Faulty {
    up: NodeClient<Channel>,
    fault: Fault,
}

impl Faulty {
    fn up(&self) -> NodeClient<Channel> {
        self.up
            .clone()
            .max_decoding_message_size(qsm_proto::MAX_MESSAGE)
            .max_encoding_message_size(qsm_proto::MAX_MESSAGE)
    }
}

type BoxStream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Node for Faulty {
    async fn login(
        &self,
        r: Request<v1::LoginRequest>,
    ) -> Result<Response<v1::LoginReply>, Status> {
        self.up().login(r).await
    }
    async fn logout(&self, r: Request<v1::Empty>) -> Result<Response<v1::Empty>, Status> {
        self.up().logout(r).await
    }
    async fn filespaces(
        &self,
        r: Request<v1::Empty>,
    ) -> Result<Response<v1::FilespaceList>, Status> {
        self.up().filespaces(r).await
    }
    async fn open_filespace(
        &self,
        r: Request<v1::OpenFilespaceRequest>,
    ) -> Result<Response<v1::Filespace>, Status> {
        self.up().open_filespace(r).await
    }
    type InventoryStream = tonic::Streaming<v1::VersionBatch>;
    async fn inventory(
        &self,
        r: Request<v1::InventoryRequest>,
    ) -> Result<Response<Self::InventoryStream>, Status> {
        self.up().inventory(r).await
    }
    async fn object(&self, r: Request<v1::ObjectRequest>) -> Result<Response<v1::Version>, Status> {
        self.up().object(r).await
    }
    type BackupStream = BoxStream<v1::BackupReply>;
    async fn backup(
        &self,
        _: Request<tonic::Streaming<v1::BackupRequest>>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        Err(Status::unimplemented("the faulty test server takes no backups"))
    }
    type FetchStream = BoxStream<v1::FrameBatch>;
    async fn fetch(
        &self,
        r: Request<v1::FetchRequest>,
    ) -> Result<Response<Self::FetchStream>, Status> {
        let mut stream = self.up().fetch(r).await?.into_inner();
        let mut frames = Vec::new();
        while let Some(batch) = stream.message().await? {
            frames.extend(batch.frames);
        }
        let frames = self.fault.mangle(frames);
        // One frame a message, so the client's reading never depends on how they were batched.
        let out = frames.into_iter().map(|f| Ok(v1::FrameBatch { frames: vec![f] }));
        Ok(Response::new(Box::pin(tokio_stream::iter(out.collect::<Vec<_>>()))))
    }
    async fn dedup_info(
        &self,
        r: Request<v1::Empty>,
    ) -> Result<Response<v1::DedupInfoReply>, Status> {
        self.up().dedup_info(r).await
    }
    async fn have_chunks(
        &self,
        r: Request<v1::HaveChunksRequest>,
    ) -> Result<Response<v1::HaveChunksReply>, Status> {
        self.up().have_chunks(r).await
    }
    async fn put_key(&self, r: Request<v1::KeyFile>) -> Result<Response<v1::Empty>, Status> {
        self.up().put_key(r).await
    }
    async fn get_key(&self, r: Request<v1::Empty>) -> Result<Response<v1::KeyFile>, Status> {
        self.up().get_key(r).await
    }
    async fn mgmt_classes(&self, r: Request<v1::Empty>) -> Result<Response<v1::ClassList>, Status> {
        self.up().mgmt_classes(r).await
    }
    async fn schedules(
        &self,
        r: Request<v1::SchedulesRequest>,
    ) -> Result<Response<v1::DueList>, Status> {
        self.up().schedules(r).await
    }
    async fn start_event(
        &self,
        r: Request<v1::StartEventRequest>,
    ) -> Result<Response<v1::StartEventReply>, Status> {
        self.up().start_event(r).await
    }
    async fn end_event(
        &self,
        r: Request<v1::EndEventRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        self.up().end_event(r).await
    }
    async fn client_options(
        &self,
        r: Request<v1::Empty>,
    ) -> Result<Response<v1::Cloptset>, Status> {
        self.up().client_options(r).await
    }
}

/// A faulty server in front of `upstream` on a free port of 127.0.0.1, serving until the
/// returned runtime is dropped; and its URL.
fn faulty_server(upstream: &str, fault: Fault) -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (listener, up) = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = Channel::from_shared(upstream.to_owned()).unwrap().connect().await.unwrap();
        (listener, up)
    });
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service = NodeServer::new(Faulty { up: NodeClient::new(up), fault })
        .max_decoding_message_size(qsm_proto::MAX_MESSAGE)
        .max_encoding_message_size(qsm_proto::MAX_MESSAGE);
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (rt, url)
}

/// Every `.qsm-restore-*` temporary below `dir`.
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().map(Result::unwrap) {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.file_name().as_bytes().starts_with(b".qsm-restore-") {
                found.push(e.path());
            }
        }
    }
    found
}

#[test]
fn a_faulty_server_fails_the_file_it_mangles_by_name_and_the_others_restore() {
    let dir = TempDir::new().unwrap();
    let server = ServerProc::start(&dir.path().join("srv"));
    let node = NodeLogin::register(&server, dir.path());
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    // Incompressible and five quanta long: the file with the most frames, the one mangled;
    // named to come between the others, which are sent in path order.
    fs::write(src.join("m-victim.bin"), noise(5 << 20, 0x9E37_79B9_7F4A_7C15)).unwrap();
    fs::write(src.join("a.txt"), b"alpha\n".repeat(1000)).unwrap();
    fs::write(src.join("sub/b.bin"), noise(1 << 20, 0x2545_F491_4F6C_DD1D)).unwrap();
    fs::write(src.join("sub/z.txt"), b"zulu\n".repeat(100)).unwrap();
    fs::write(src.join("empty"), b"").unwrap();
    node.client(&server.url, dir.path()).arg("backup").arg(&src).assert().success();
    let others = ["a.txt", "sub/b.bin", "sub/z.txt", "empty"];

    let cases = [
        (Fault::Withhold, "are missing"),
        (Fault::Duplicate, "again or out of order"),
        (Fault::Reorder, "are missing"),
        (Fault::LastEarly, "ended at byte"),
        (Fault::Truncate, "ended at byte"),
        (Fault::NoData, "sent no data for bytes"),
        (Fault::PastEnd, "of a file of"),
        (Fault::AfterLast, "after its last frame"),
        (Fault::Cut, "ended at byte"),
        (Fault::Skip, "ended at byte"),
        (Fault::Foreign, "object 999999999 among this file's"),
    ];
    for (fault, why) in cases {
        let (_rt, url) = faulty_server(&server.url, fault);
        let to = dir.path().join(format!("to-{fault:?}"));
        let out =
            node.client(&url, dir.path()).arg("restore").arg(&src).arg("--to").arg(&to).output();
        let out = out.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said = format!("{}/m-victim.bin: not restored:", src.display());
        let line = stderr.lines().find(|l| l.contains(&said));
        assert!(
            line.is_some_and(|l| l.contains(why)),
            "{fault:?}: expected `{said} ... {why}`:\n{stderr}"
        );
        assert!(!to.join("m-victim.bin").exists(), "{fault:?}: the mangled file was written");
        assert_eq!(temporaries(&to), Vec::<PathBuf>::new(), "{fault:?}: temporaries left");
        if fault == Fault::Cut {
            // Nothing comes after the cut: what was still to come fails too, by name, never
            // written partly; what came before it is restored.
            assert_eq!(out.status.code(), Some(4), "{fault:?}: {stderr}");
            assert!(
                stderr.contains("sub/z.txt: not restored: the server's data ended before"),
                "{stderr}"
            );
            assert_eq!(fs::read(to.join("a.txt")).unwrap(), fs::read(src.join("a.txt")).unwrap());
            for rel in others {
                let p = to.join(rel);
                assert!(
                    !p.exists() || fs::read(&p).unwrap() == fs::read(src.join(rel)).unwrap(),
                    "{fault:?}: {rel} written wrong"
                );
            }
            continue;
        }
        // The others came back whole: a partial success.
        assert_eq!(out.status.code(), Some(4), "{fault:?}: {stderr}");
        for rel in others {
            assert_eq!(
                fs::read(to.join(rel)).unwrap(),
                fs::read(src.join(rel)).unwrap(),
                "{fault:?}: {rel}"
            );
        }
        assert_eq!(stderr.matches("not restored").count(), 1, "{fault:?}: {stderr}");
    }

    // The same server, not mangling... is the real one: everything restores, exit 0.
    let to = dir.path().join("to-real");
    node.client(&server.url, dir.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&to)
        .assert()
        .code(0);
    assert_eq!(
        fs::read(to.join("m-victim.bin")).unwrap(),
        fs::read(src.join("m-victim.bin")).unwrap()
    );
}

/// With `--require-encryption`, a sealed file whose frames the server sends without data, or
/// cuts short, is refused like any other: what carries no data cannot be checked for a seal.
#[test]
fn with_encryption_required_a_file_without_its_sealed_data_is_refused() {
    let dir = TempDir::new().unwrap();
    let server = ServerProc::start(&dir.path().join("srv"));
    let node = NodeLogin::register(&server, dir.path());
    let pass = dir.path().join("pass");
    fs::write(&pass, "correct horse battery staple\n").unwrap();
    fs::set_permissions(&pass, fs::Permissions::from_mode(0o600)).unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("victim.bin"), noise(5 << 20, 0x9E37_79B9_7F4A_7C15)).unwrap();
    fs::write(src.join("a.txt"), b"alpha\n".repeat(1000)).unwrap();
    node.client(&server.url, dir.path())
        .env("QSM_PASSPHRASE_FILE", &pass)
        .args(["backup", "--encryption", "on"])
        .arg(&src)
        .assert()
        .success();
    for (fault, why) in [(Fault::NoData, "sent no data for bytes"), (Fault::Truncate, "ended at")] {
        let (_rt, url) = faulty_server(&server.url, fault);
        let to = dir.path().join(format!("to-{fault:?}"));
        let out = node
            .client(&url, dir.path())
            .env("QSM_PASSPHRASE_FILE", &pass)
            .args(["restore", "--require-encryption"])
            .arg(&src)
            .arg("--to")
            .arg(&to)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{fault:?}: {stderr}");
        assert!(
            stderr.lines().any(|l| l.contains("victim.bin: not restored:") && l.contains(why)),
            "{fault:?}: {stderr}"
        );
        assert!(!to.join("victim.bin").exists());
        assert_eq!(fs::read(to.join("a.txt")).unwrap(), b"alpha\n".repeat(1000));
        assert_eq!(temporaries(&to), Vec::<PathBuf>::new());
    }
}

/// Only the mangled file was asked for: nothing else restored, so the restore failed (exit 1).
#[test]
fn a_restore_whose_only_file_a_faulty_server_mangles_exits_1() {
    let dir = TempDir::new().unwrap();
    let server = ServerProc::start(&dir.path().join("srv"));
    let node = NodeLogin::register(&server, dir.path());
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("victim.bin"), noise(5 << 20, 0x9E37_79B9_7F4A_7C15)).unwrap();
    node.client(&server.url, dir.path()).arg("backup").arg(&src).assert().success();
    let (_rt, url) = faulty_server(&server.url, Fault::Withhold);
    let to = dir.path().join("to");
    let out = node
        .client(&url, dir.path())
        .arg("restore")
        .arg(src.join("victim.bin"))
        .arg("--to")
        .arg(&to)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("victim.bin: not restored:"), "{stderr}");
    assert!(stderr.contains("every file failed"), "{stderr}");
    assert!(!to.join("victim.bin").exists());
}

/// `qsm` on the embedded store in `home`.
fn qsm(home: &Path) -> Command {
    let mut c = Command::cargo_bin("qsm").unwrap();
    c.env("QSM_HOME", home);
    c
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Sets `p`'s mtime to `secs` (through `touch`, which the test machines have).
fn set_mtime(p: &Path, secs: i64) {
    let status =
        StdCommand::new("touch").arg("-h").arg("-d").arg(format!("@{secs}")).arg(p).status();
    assert!(status.unwrap().success());
}

/// Issue 22: `qsm restore /srv/priv --to /srv/shared` made a 1777 /srv/shared 0700. An existing
/// target keeps its mode, owner and times; a target the restore creates gets the root's.
#[test]
fn an_existing_target_keeps_its_mode_owner_and_times_and_a_new_one_gets_the_roots() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("priv");
    fs::create_dir_all(src.join("inner")).unwrap();
    fs::write(src.join("inner/f.txt"), b"private\n").unwrap();
    fs::set_permissions(src.join("inner"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o700)).unwrap();
    set_mtime(&src, 1_000_000_000);
    qsm(home.path()).arg("backup").arg(&src).assert().success();

    let shared = dir.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    set_mtime(&shared, 1_500_000_000);
    let before = fs::metadata(&shared).unwrap();
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&shared).assert().success();
    let after = fs::metadata(&shared).unwrap();
    assert_eq!(mode(&shared), 0o1777, "the existing target's mode changed");
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()), "its owner changed");
    // Its mtime moves as entries are added to it, as for any directory written into, but it
    // is never set to the backed-up root's.
    assert_ne!(after.mtime(), 1_000_000_000, "the root's mtime was applied to the target");
    assert_eq!(fs::read(shared.join("inner/f.txt")).unwrap(), b"private\n");
    assert_eq!(mode(&shared.join("inner")), 0o750, "what was restored got its own mode");
    // Restored again, everything exists and is skipped: nothing is written into the target,
    // so its mtime stays exactly as it was.
    set_mtime(&shared, 1_500_000_000);
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&shared).assert().success();
    assert_eq!(fs::metadata(&shared).unwrap().mtime(), 1_500_000_000);
    assert_eq!(mode(&shared), 0o1777);

    // --replace: asked to replace what exists, the target included.
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&shared)
        .arg("--replace")
        .assert()
        .success();
    assert_eq!(mode(&shared), 0o700);
    assert_eq!(fs::metadata(&shared).unwrap().mtime(), 1_000_000_000);

    // A target the restore creates is the root restored: the root's mode and times.
    let fresh = dir.path().join("fresh");
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&fresh).assert().success();
    assert_eq!(mode(&fresh), 0o700);
    assert_eq!(fs::metadata(&fresh).unwrap().mtime(), 1_000_000_000);
}

/// `qsm restore S/a/b/file`: the directories on the way are created with their backed-up
/// metadata, not owner-only; nothing else of them is restored; existing ones are left alone.
#[test]
fn a_partial_restore_creates_the_directories_on_its_way_with_their_metadata() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("a/b")).unwrap();
    fs::write(src.join("a/b/file"), b"wanted\n").unwrap();
    fs::write(src.join("a/sibling"), b"not wanted\n").unwrap();
    fs::write(src.join("top"), b"not wanted\n").unwrap();
    fs::set_permissions(src.join("a/b"), fs::Permissions::from_mode(0o705)).unwrap();
    fs::set_permissions(src.join("a"), fs::Permissions::from_mode(0o751)).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
    set_mtime(&src.join("a/b"), 1_100_000_000);
    set_mtime(&src.join("a"), 1_200_000_000);
    qsm(home.path()).arg("backup").arg(&src).assert().success();

    let out = dir.path().join("out");
    qsm(home.path())
        .arg("restore")
        .arg(src.join("a/b/file"))
        .arg("--to")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicates::str::contains("restored 1,"));
    assert_eq!(fs::read(out.join("a/b/file")).unwrap(), b"wanted\n");
    assert_eq!(mode(&out.join("a")), 0o751);
    assert_eq!(mode(&out.join("a/b")), 0o705);
    assert_eq!(fs::metadata(out.join("a")).unwrap().mtime(), 1_200_000_000);
    assert_eq!(fs::metadata(out.join("a/b")).unwrap().mtime(), 1_100_000_000);
    assert!(!out.join("a/sibling").exists() && !out.join("top").exists());

    // Existing directories on the way are not asked for: left as they are, even replacing.
    let again = dir.path().join("again");
    fs::create_dir_all(again.join("a")).unwrap();
    fs::set_permissions(again.join("a"), fs::Permissions::from_mode(0o777)).unwrap();
    qsm(home.path())
        .arg("restore")
        .arg(src.join("a/b"))
        .arg("--to")
        .arg(&again)
        .arg("--replace")
        .assert()
        .success();
    assert_eq!(mode(&again.join("a")), 0o777);
    assert_eq!(mode(&again.join("a/b")), 0o705);
}

/// A killed restore's temporaries are removed by the next one in the directories it writes:
/// only regular files of the exact pattern whose process is gone.
#[test]
fn leftovers_of_killed_restores_are_removed_and_counted_and_nothing_else() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f.txt"), b"data\n").unwrap();
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    let out = dir.path().join("out");
    fs::create_dir_all(out.join("d")).unwrap();
    // No process has this id: pid_max is at most 2^22 on Linux.
    let dead = out.join("d/.qsm-restore-4194999-17");
    fs::write(&dead, vec![0u8; 4096]).unwrap();
    let dead_top = out.join(".qsm-restore-4194998-3");
    fs::write(&dead_top, b"x").unwrap();
    // Not provably a leftover: a live process's (this test's), a name off the pattern, a
    // directory, a symlink.
    let live = out.join(format!("d/.qsm-restore-{}-17", std::process::id()));
    fs::write(&live, b"live").unwrap();
    let odd = out.join("d/.qsm-restore-4194999-17x");
    fs::write(&odd, b"odd").unwrap();
    let a_dir = out.join("d/.qsm-restore-4194999-18");
    fs::create_dir(&a_dir).unwrap();
    let a_link = out.join("d/.qsm-restore-4194999-19");
    std::os::unix::fs::symlink("f.txt", &a_link).unwrap();

    let report: serde_json::Value = {
        let out = qsm(home.path())
            .arg("restore")
            .arg(&src)
            .arg("--to")
            .arg(&out)
            .arg("--json")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    assert_eq!(report["leftovers_removed"], 2, "{report}");
    assert!(!dead.exists() && !dead_top.exists());
    assert!(live.exists() && odd.exists() && a_dir.exists());
    assert!(fs::symlink_metadata(&a_link).is_ok());
    assert_eq!(fs::read(out.join("d/f.txt")).unwrap(), b"data\n");

    // Said in the text summary too.
    fs::write(&dead, b"again").unwrap();
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicates::str::contains("removed 1 temporary files left by interrupted"));
}

/// Nothing matched: exit 1, a clear message, and no target created.
#[test]
fn a_restore_that_matches_nothing_exits_1_and_creates_no_target() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f.txt"), b"data\n").unwrap();
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    let out = dir.path().join("out");
    qsm(home.path())
        .arg("restore")
        .arg(src.join("no-such-file"))
        .arg("--to")
        .arg(&out)
        .assert()
        .code(1)
        .stderr(
            predicates::str::contains("nothing to restore")
                .and(predicates::str::contains("no-such-file")),
        );
    assert!(!out.exists(), "a restore of nothing created its target");
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .args(["--pit", "@1000", "--to"])
        .arg(&out)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("was active at @1000"));
    assert!(!out.exists());
    qsm(home.path())
        .arg("retrieve")
        .arg(&src)
        .arg("--to")
        .arg(&out)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("nothing to retrieve"));
    assert!(!out.exists());
}

/// Every file failed: exit 1, not 4, even though directories were made.
#[test]
fn a_restore_where_every_file_failed_exits_1() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f.txt"), b"data\n").unwrap();
    fs::write(src.join("g.txt"), b"more\n").unwrap();
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    // Directories where the files go: replacing them is refused, file by file.
    let out = dir.path().join("out");
    fs::create_dir_all(out.join("d/f.txt")).unwrap();
    fs::create_dir_all(out.join("g.txt")).unwrap();
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&out)
        .arg("--replace")
        .assert()
        .code(1)
        .stderr(
            predicates::str::contains("d/f.txt: not restored")
                .and(predicates::str::contains("g.txt: not restored"))
                .and(predicates::str::contains("every file failed")),
        );
    // One of them restorable: a partial success.
    fs::remove_dir(out.join("g.txt")).unwrap();
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&out)
        .arg("--replace")
        .assert()
        .code(4);
    assert_eq!(fs::read(out.join("g.txt")).unwrap(), b"more\n");
}

/// Names that are not UTF-8 are named on the command line as they are, and `--json` gives
/// their exact bytes in `path_hex` (and `target_hex`) beside a lossy `path`.
#[test]
fn names_that_are_not_utf8_are_named_on_the_command_line_and_exact_in_json() {
    use std::ffi::OsStr;
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    let bad = OsStr::from_bytes(b"caf\xff");
    let bad2 = OsStr::from_bytes(b"caf\xfe");
    fs::create_dir_all(src.join(bad)).unwrap();
    fs::write(src.join(bad).join("inner.txt"), b"inside\n").unwrap();
    fs::write(src.join(bad2), b"second\n").unwrap();
    fs::write(src.join("plain.txt"), b"plain\n").unwrap();
    qsm(home.path()).arg("backup").arg(&src).assert().success();

    // Two names that print alike are told apart by their bytes.
    let out = qsm(home.path()).args(["query", "backup", "--json"]).arg(&src).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let hex =
        |row: &serde_json::Value| row.get("path_hex").and_then(|h| h.as_str().map(str::to_owned));
    let rows = rows.as_array().unwrap();
    let by_hex: Vec<_> = rows.iter().filter_map(hex).collect();
    assert!(by_hex.contains(&"636166ff".to_owned()), "{rows:?}");
    assert!(by_hex.contains(&"636166fe".to_owned()), "{rows:?}");
    assert!(by_hex.contains(&"636166ff2f696e6e65722e747874".to_owned()), "{rows:?}");
    let plain = rows.iter().find(|r| r["path"] == "plain.txt").unwrap();
    assert!(plain.get("path_hex").is_none(), "a UTF-8 name has no hex: {plain}");

    // A path below a filespace, not UTF-8: only what is below it.
    let out =
        qsm(home.path()).args(["query", "backup", "--json"]).arg(src.join(bad)).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let below: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(below.as_array().unwrap().len(), 2, "{below}");

    // Restored by its byte name, into a target whose name is not UTF-8 either.
    let to = dir.path().join(OsStr::from_bytes(b"to\xff"));
    let out = qsm(home.path())
        .arg("restore")
        .arg(src.join(bad))
        .arg("--to")
        .arg(&to)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want: String = to.as_os_str().as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(report["target_hex"], want, "{report}");
    assert_eq!(fs::read(to.join(bad).join("inner.txt")).unwrap(), b"inside\n");
    assert!(!to.join(bad2).exists() && !to.join("plain.txt").exists());

    // A file that fails is named exactly in `failed_paths`.
    fs::create_dir(to.join(bad2)).unwrap();
    let out = qsm(home.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&to)
        .args(["--replace", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["failed_paths"],
        serde_json::json!([{"path": "caf\u{fffd}", "path_hex": "636166fe"}]),
        "{report}"
    );
}

/// Issue 24.3: a restore takes only what `--include` and `--exclude` select (the backup's
/// pattern language), `--dry-run` lists it and writes nothing, and `qsm query backup` says
/// so when a path lists nothing.
#[test]
fn restore_selects_with_patterns_and_dry_run_writes_nothing() {
    let dir = TempDir::new().unwrap();
    let home = dir.path().join("home");
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("etc/ssh")).unwrap();
    fs::create_dir_all(src.join("cache")).unwrap();
    fs::write(src.join("etc/ssh/sshd.conf"), b"port 22\n").unwrap();
    fs::write(src.join("etc/hosts"), b"127.0.0.1 localhost\n").unwrap();
    fs::write(src.join("cache/big.bin"), vec![7u8; 10_000]).unwrap();
    fs::write(src.join("notes.conf"), b"x\n").unwrap();
    qsm(&home).arg("backup").arg(&src).assert().success();

    // Names at any depth; the directories on the way come too, nothing else.
    let to = dir.path().join("conf");
    qsm(&home)
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&to)
        .args(["--include", "*.conf"])
        .assert()
        .success();
    assert_eq!(fs::read(to.join("etc/ssh/sshd.conf")).unwrap(), b"port 22\n");
    assert_eq!(fs::read(to.join("notes.conf")).unwrap(), b"x\n");
    assert!(!to.join("etc/hosts").exists() && !to.join("cache").exists());

    // An excluded directory takes everything below it; an exclude beats an include.
    let to = dir.path().join("most");
    qsm(&home)
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&to)
        .args(["--exclude", "cache/", "--exclude", "notes.conf", "--include", "*.conf"])
        .assert()
        .success();
    assert!(to.join("etc/ssh/sshd.conf").exists());
    assert!(!to.join("cache").exists() && !to.join("notes.conf").exists());

    // A dry run lists with sizes, as text and JSON, and writes nothing.
    let to = dir.path().join("dry");
    let out = qsm(&home)
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&to)
        .args(["--exclude", "etc/", "--dry-run", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let paths: Vec<&str> =
        plan["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert!(paths.contains(&"cache/big.bin") && !paths.iter().any(|p| p.starts_with("etc")));
    assert_eq!(plan["bytes"], 10_002, "{plan}");
    assert!(!to.exists(), "a dry run wrote {}", to.display());
    qsm(&home)
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&to)
        .arg("--dry-run")
        .assert()
        .success()
        .stdout(
            predicate::str::contains("cache/big.bin")
                .and(predicate::str::contains("nothing was written")),
        );
    assert!(!to.exists());

    // Patterns that match nothing fail (exit 1), saying so; a bad pattern is bad usage.
    qsm(&home)
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&to)
        .args(["--include", "*.md"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("match nothing"));
    assert!(!to.exists());
    qsm(&home)
        .arg("restore")
        .arg(&src)
        .args(["--include", "[", "--dry-run"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("include pattern"));

    // `query backup` of a file lists it; of a path nothing was backed up at, says so.
    let out =
        qsm(&home).args(["query", "backup", "--json"]).arg(src.join("etc/hosts")).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    qsm(&home)
        .args(["query", "backup"])
        .arg(src.join("etc/nope"))
        .assert()
        .code(1)
        .stderr(predicate::str::contains("no active backup version"));
}

/// Issue 24.3: `--tar` streams the selection as a tar that GNU tar extracts with its content,
/// links, long names and extended attributes; `--to -` writes one file's bytes to stdout.
#[test]
fn restore_streams_a_tar_and_one_file_to_stdout() {
    let dir = TempDir::new().unwrap();
    let home = dir.path().join("home");
    let src = dir.path().join("src");
    let long = "n".repeat(120);
    fs::create_dir_all(src.join("d").join(&long)).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(src.join("d/big.bin"), &data).unwrap();
    fs::write(src.join("d").join(&long).join("deep.txt"), b"deep\n").unwrap();
    fs::hard_link(src.join("d/big.bin"), src.join("d/big.link")).unwrap();
    std::os::unix::fs::symlink("big.bin", src.join("d/sym")).unwrap();
    let sparse = fs::File::create(src.join("d/sparse")).unwrap();
    sparse.set_len(5 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"middle", 2 << 20).unwrap();
    drop(sparse);
    let xattr_ok = rustix::fs::setxattr(
        src.join("d/big.bin"),
        "user.qsm",
        b"tagged",
        rustix::fs::XattrFlags::empty(),
    )
    .is_ok();
    qsm(&home).arg("backup").arg(&src).assert().success();

    let tarball = dir.path().join("out.tar");
    qsm(&home).arg("restore").arg(src.join("d")).arg("--tar").arg(&tarball).assert().success();
    let out = dir.path().join("x");
    fs::create_dir(&out).unwrap();
    let untar = StdCommand::new("tar")
        .args(["--xattrs", "--xattrs-include=*", "-xpf"])
        .arg(&tarball)
        .arg("-C")
        .arg(&out)
        .output()
        .unwrap();
    assert!(untar.status.success(), "{untar:?}");
    let got = out.join("d");
    assert_eq!(fs::read(got.join("big.bin")).unwrap(), data);
    assert_eq!(fs::read(got.join(&long).join("deep.txt")).unwrap(), b"deep\n");
    assert_eq!(fs::read_link(got.join("sym")).unwrap(), Path::new("big.bin"));
    let ino = |p: &Path| fs::metadata(p).unwrap().ino();
    assert_eq!(ino(&got.join("big.bin")), ino(&got.join("big.link")), "one inode");
    let sparse = fs::read(got.join("sparse")).unwrap();
    assert_eq!(sparse.len(), 5 << 20);
    assert_eq!(&sparse[2 << 20..(2 << 20) + 6], b"middle");
    assert!(sparse[..2 << 20].iter().all(|&b| b == 0));
    if xattr_ok {
        let mut value = [0u8; 16];
        let n = rustix::fs::getxattr(got.join("big.bin"), "user.qsm", &mut value).unwrap();
        assert_eq!(&value[..n], b"tagged");
    }

    // An existing file is not written over; a stream is not combined with --replace.
    qsm(&home)
        .arg("restore")
        .arg(src.join("d"))
        .arg("--tar")
        .arg(&tarball)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("already exists"));
    qsm(&home).arg("restore").arg(&src).args(["--tar", "-", "--replace"]).assert().code(2);

    // One file to stdout; a directory is refused; a reader that goes early is no failure.
    let bytes = qsm(&home).arg("restore").arg(src.join("d/big.bin")).args(["--to", "-"]).output();
    let bytes = bytes.unwrap();
    assert!(bytes.status.success(), "{bytes:?}");
    assert_eq!(bytes.stdout, data);
    qsm(&home).arg("restore").arg(src.join("d")).args(["--to", "-"]).assert().code(2);
    let piped = StdCommand::new("bash")
        .arg("-c")
        .arg(format!(
            "{} restore {} --tar - | head -c 100 >/dev/null; echo ${{PIPESTATUS[0]}}",
            assert_cmd::cargo::cargo_bin("qsm").display(),
            src.display()
        ))
        .env("QSM_HOME", &home)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&piped.stdout).trim().to_owned();
    assert!(status == "0" || status == "141", "{piped:?}");
    assert!(!String::from_utf8_lossy(&piped.stderr).contains("panicked"), "{piped:?}");
}

/// Issue 24: a restore onto a disk too small for it names each file that did not fit, leaves
/// no temporary behind (a file of several quanta is allocated whole before it is written, so
/// it fails at once instead of filling the disk), and what fit is whole: a partial success,
/// exit 4. Needs root to mount the small disk.
#[test]
fn a_restore_to_a_full_disk_names_what_did_not_fit_and_leaves_no_temporaries() {
    let Some(disk) = qsm_catalog::testing::Tmpfs::mount("restore_full_disk", "2m").unwrap() else {
        return;
    };
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("small")).unwrap();
    let big: Vec<u8> =
        (0..(6u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    fs::write(src.join("big.bin"), &big).unwrap();
    for i in 0..20 {
        fs::write(src.join(format!("small/{i}.txt")), format!("{i}\n").repeat(200)).unwrap();
    }
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    let out = disk.path().join("out");
    qsm(home.path()).arg("restore").arg(&src).arg("--to").arg(&out).assert().code(4).stderr(
        predicates::str::contains("big.bin: not restored")
            .and(predicates::str::contains("No space left on device")),
    );
    assert!(!out.join("big.bin").exists());
    assert_eq!(temporaries(&out), Vec::<PathBuf>::new());
    for i in 0..20 {
        let back = fs::read(out.join(format!("small/{i}.txt"))).unwrap();
        assert_eq!(back, format!("{i}\n").repeat(200).into_bytes());
    }
}

/// Issue 24: `--sync` restores as without it (it adds a `syncfs` of the target's file system
/// before reporting success, which a test cannot observe short of a power cut; the
/// qsm-powercut harness does not answer FUSE's syncfs); it means nothing for a stream, and
/// says so.
#[test]
fn restore_sync_restores_and_is_refused_with_a_stream() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a.txt"), b"synced\n").unwrap();
    qsm(home.path()).arg("backup").arg(&src).assert().success();
    let out = dir.path().join("out");
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&out)
        .arg("--sync")
        .assert()
        .success();
    assert_eq!(fs::read(out.join("a.txt")).unwrap(), b"synced\n");
    qsm(home.path())
        .arg("restore")
        .arg(&src)
        .args(["--tar", "-", "--sync"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--sync"));
}

/// Issue 24: large files are written past the page cache (`O_DIRECT`), their last block
/// padded and the file cut back to its length; a deduplicated file's chunks start anywhere,
/// so its writes go through the page cache after its first unaligned one. Every way, on one
/// thread or many, each file comes back byte for byte at its own length; the page cache
/// shows which way it went (`fincore`, util-linux). Restored to the build's own directory,
/// on a disk; on a file system that is not a local disk's (a tmpfs), nothing is direct.
#[test]
fn large_files_restore_exactly_whether_written_directly_or_not() {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let fs_type = StdCommand::new("stat").args(["-f", "-c", "%T"]).arg(base).output().unwrap();
    let fs_type = String::from_utf8_lossy(&fs_type.stdout).trim().to_owned();
    let disk = ["ext2/ext3", "xfs", "btrfs", "f2fs"].contains(&fs_type.as_str());
    let dir = TempDir::new_in(base).unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let mib = 1usize << 20;
    let sizes = [8 * mib, 8 * mib + 1, 9 * mib + 4097, 12 * mib - 1];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for (i, size) in sizes.iter().enumerate() {
        // Half compressible text, half noise (xorshift: content-defined chunks cut it
        // anywhere): frames of both kinds.
        let data: Vec<u8> = (0..*size)
            .map(|j| match (j / mib) % 2 {
                0 => b"the quick brown fox jumps over the lazy dog\n"[j % 44],
                _ => {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                }
            })
            .collect();
        fs::write(src.join(format!("f{i}")), data).unwrap();
    }
    let cached = |f: &Path| -> u64 {
        let out = StdCommand::new("fincore")
            .args(["--bytes", "--noheadings", "--raw", "-o", "RES"])
            .arg(f)
            .output()
            .unwrap();
        assert!(out.status.success(), "fincore: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    for dedup in ["off", "on"] {
        let home = TempDir::new_in(base).unwrap();
        qsm(home.path()).arg("backup").arg(&src).args(["--dedup", dedup]).assert().success();
        for threads in ["1", "4"] {
            let out = dir.path().join(format!("out-{dedup}-{threads}"));
            qsm(home.path())
                .arg("restore")
                .arg(&src)
                .arg("--to")
                .arg(&out)
                .args(["-T", threads])
                .assert()
                .success();
            for (i, size) in sizes.iter().enumerate() {
                let (a, b) = (src.join(format!("f{i}")), out.join(format!("f{i}")));
                // Before reading it back, which fills the cache.
                let cached = cached(&b);
                if dedup == "off" && disk {
                    assert_eq!(cached, 0, "{b:?}: written directly, nothing is cached");
                } else {
                    assert!(cached > 0, "{b:?} ({fs_type}, dedup {dedup}): not direct");
                }
                assert_eq!(fs::read(&b).unwrap(), fs::read(&a).unwrap(), "{b:?}");
                // The padding cut away.
                assert_eq!(fs::metadata(&b).unwrap().len(), *size as u64, "{b:?}");
            }
        }
    }
}
