//! What a client needs of a server, whether it runs in the same process (the embedded
//! default) or across a network. Every operation acts on one node's data: the node is fixed
//! when the connection is made, so a client cannot name another's filespaces, and the server
//! checks that again on every request.

use crate::ServerError;
use crate::model::{
    ArchiveCopyGroup, Filespace, FilespaceId, NewObject, ObjectId, ObjectVersion, OptionSet,
    RunResult, Timestamp, TxnLimits,
};

/// The result of a server operation.
pub type Result<T> = std::result::Result<T, ServerError>;

/// What the server says of its work on a backup's stream, all counted from the stream's
/// start: seconds it spent storing what arrived, the frame bytes stored, and the seconds the
/// stream has been open.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServerLoad {
    /// Seconds spent storing.
    pub busy: f64,
    /// Frame bytes stored.
    pub bytes: u64,
    /// Seconds since the stream opened.
    pub elapsed: f64,
}

/// Which versions an inventory lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The active backup versions.
    Active,
    /// Every version: active, inactive and archives.
    All,
}

/// A backup session's connection to its server.
pub trait Server: Send + Sync {
    /// Where the data goes, for messages ("embedded store in ~/.local/share/qsm").
    fn describe(&self) -> String;
    /// Whether this process stores what it sends (the embedded store): sending is then
    /// writing the pool's disk, not a network.
    fn stores_here(&self) -> bool {
        false
    }
    /// Whether the server runs on this machine (reached at a loopback address): storing what
    /// this process sends then takes this machine's cores too.
    fn shares_this_machine(&self) -> bool {
        false
    }
    /// The node's filespaces.
    fn filespaces(&self) -> Result<Vec<Filespace>>;
    /// The node's filespace `name`, created when `create` is set and it does not exist.
    fn open_filespace(&self, name: &str, create: bool) -> Result<Option<FilespaceId>>;
    /// Calls `f` with each version of `filespace` in `scope`, in path order (newest first
    /// within a path), streamed so memory does not grow with the filespace.
    fn inventory(
        &self,
        filespace: FilespaceId,
        scope: Scope,
        f: &mut dyn FnMut(ObjectVersion) -> Result<()>,
    ) -> Result<()>;
    /// One version by id, if it is the node's.
    fn object(&self, id: ObjectId) -> Result<Option<ObjectVersion>>;
    /// Starts sending objects into `filespace`, committed in transactions within `limits`. A
    /// whole backup's end is recorded in the filespace (`Filespace::last_backup`).
    fn upload(
        &self,
        filespace: FilespaceId,
        limits: TxnLimits,
        kind: UploadKind,
    ) -> Result<Box<dyn Upload + '_>>;
    /// Streams the frames of `objects`, in that order, each object's frames in order.
    fn fetch(&self, objects: Vec<ObjectId>) -> Result<Box<dyn Fetch + '_>>;
    /// The node's dedup scope, its secret, the pool and the dedup epoch.
    fn dedup_info(&self) -> Result<DedupInfo>;
    /// Which of `ids` the node's dedup scope holds (committed and referenced), as sealed
    /// chunks or as plaintext ones.
    fn have_chunks(&self, ids: &[[u8; 32]], sealed: bool) -> Result<Vec<bool>>;
    /// Stores the server's copy of the node's wrapped key file.
    fn put_key(&self, key_file: &[u8]) -> Result<()>;
    /// The server's copy of the node's wrapped key file, if any.
    fn get_key(&self) -> Result<Option<Vec<u8>>>;
    /// The management classes of the node's policy domain.
    fn mgmt_classes(&self) -> Result<Vec<ClassInfo>>;
    /// The node's client schedules, each with the window it is due to run in; `fresh` on a
    /// scheduler's first call, which severs the node's events its predecessor left started.
    fn schedules(&self, fresh: bool) -> Result<Schedules>;
    /// Starts the node's event of `schedule` in its window open now, starting at `window`:
    /// its id, or `None` if the node has this window's event already (another scheduler of
    /// the node ran it).
    fn start_event(&self, schedule: &str, window: Timestamp) -> Result<Option<i64>>;
    /// Ends the node's started event `event` with its outcome.
    fn end_event(&self, event: i64, result: RunResult, detail: &str) -> Result<()>;
    /// The client option set the server gives the node, if any.
    fn client_options(&self) -> Result<Option<OptionSet>>;
}

/// A client schedule's window a node is due to run in (`qsm sched`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub domain: String,
    pub schedule: String,
    /// `incremental`, `selective` or `archive`.
    pub action: String,
    /// The paths (none, for an incremental: each of the node's filespaces).
    pub objects: Vec<String>,
    /// The window opens at `window_start` and closes at `window_end` (server time).
    pub window_start: Timestamp,
    pub window_end: Timestamp,
}

/// A node's client schedules, with the server's clock (which the windows follow).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Schedules {
    pub now: Timestamp,
    pub due: Vec<Due>,
}

/// A management class of the node's domain, as a client needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassInfo {
    /// Its name.
    pub name: String,
    /// Days it keeps archives (`u32::MAX`: for ever).
    pub archive_days: u32,
}

/// Days an archive bound to `class` (`None`: the domain's default, the class called
/// `standard`, or TSM's 365 days without one) is kept when `requested` days were asked for:
/// the class's retention, which a request can lengthen but never shorten (as expiration
/// applies it).
pub fn archive_retention(
    classes: &[ClassInfo],
    class: Option<&str>,
    requested: Option<u32>,
) -> u32 {
    // The domain's default class is the one called "standard", as expiration reads it.
    let name = class.unwrap_or("standard");
    let by_class = classes
        .iter()
        .find(|c| c.name == name)
        .map_or(ArchiveCopyGroup::default().retain_version_days, |c| c.archive_days);
    by_class.max(requested.unwrap_or(0))
}

/// What deduplication needs to know of the server.
#[derive(Clone, PartialEq, Eq)]
pub struct DedupInfo {
    /// The node's dedup scope.
    pub scope: String,
    /// The scope's secret: keys chunk ids of backups without encryption.
    pub scope_secret: [u8; 32],
    /// The pool's id.
    pub pool: String,
    /// The dedup epoch.
    pub epoch: u64,
    /// Whether the server has clients deduplicate unless they say otherwise.
    pub dedup_default: bool,
}

impl std::fmt::Debug for DedupInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupInfo")
            .field("scope", &self.scope)
            .field("pool", &self.pool)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// A borrowed server is a server (so a caller can box either kind the same way).
impl<T: Server + ?Sized> Server for &T {
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn stores_here(&self) -> bool {
        (**self).stores_here()
    }
    fn shares_this_machine(&self) -> bool {
        (**self).shares_this_machine()
    }
    fn filespaces(&self) -> Result<Vec<Filespace>> {
        (**self).filespaces()
    }
    fn open_filespace(&self, name: &str, create: bool) -> Result<Option<FilespaceId>> {
        (**self).open_filespace(name, create)
    }
    fn inventory(
        &self,
        filespace: FilespaceId,
        scope: Scope,
        f: &mut dyn FnMut(ObjectVersion) -> Result<()>,
    ) -> Result<()> {
        (**self).inventory(filespace, scope, f)
    }
    fn object(&self, id: ObjectId) -> Result<Option<ObjectVersion>> {
        (**self).object(id)
    }
    fn upload(
        &self,
        filespace: FilespaceId,
        limits: TxnLimits,
        kind: UploadKind,
    ) -> Result<Box<dyn Upload + '_>> {
        (**self).upload(filespace, limits, kind)
    }
    fn fetch(&self, objects: Vec<ObjectId>) -> Result<Box<dyn Fetch + '_>> {
        (**self).fetch(objects)
    }
    fn dedup_info(&self) -> Result<DedupInfo> {
        (**self).dedup_info()
    }
    fn have_chunks(&self, ids: &[[u8; 32]], sealed: bool) -> Result<Vec<bool>> {
        (**self).have_chunks(ids, sealed)
    }
    fn put_key(&self, key_file: &[u8]) -> Result<()> {
        (**self).put_key(key_file)
    }
    fn get_key(&self) -> Result<Option<Vec<u8>>> {
        (**self).get_key()
    }
    fn mgmt_classes(&self) -> Result<Vec<ClassInfo>> {
        (**self).mgmt_classes()
    }
    fn schedules(&self, fresh: bool) -> Result<Schedules> {
        (**self).schedules(fresh)
    }
    fn start_event(&self, schedule: &str, window: Timestamp) -> Result<Option<i64>> {
        (**self).start_event(schedule, window)
    }
    fn end_event(&self, event: i64, result: RunResult, detail: &str) -> Result<()> {
        (**self).end_event(event, result, detail)
    }
    fn client_options(&self) -> Result<Option<OptionSet>> {
        (**self).client_options()
    }
}

/// What an upload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadKind {
    /// A backup of the whole filespace: its end is the filespace's last backup.
    Backup,
    /// A backup of part of it (a file, a directory below its root) or an archive: it says
    /// nothing of whether the filespace is protected, so it is not recorded as one.
    Partial,
    /// Versions replicated from another server: neither recorded as a backup nor judged (the
    /// source judged them), and the only upload a replicated node takes.
    Replica,
}

/// Objects on their way to the server. Nothing is visible on the server before it commits;
/// [`Upload::finish`] commits the rest. Dropping an upload without finishing loses only what was
/// not committed yet.
pub trait Upload: Send {
    /// Starts an object (its filespace is the upload's); `size_hint` is the bytes expected;
    /// `class` names the management class to bind it to (`None`, or one the node's domain
    /// lacks: the default).
    fn begin_object(
        &mut self,
        object: NewObject,
        size_hint: u64,
        class: Option<&str>,
    ) -> Result<()>;
    /// The next frame of the current object.
    fn append_frame(&mut self, frame: &[u8]) -> Result<()>;
    /// The next frame of the current object with its keyed chunk id; `shared` offers it for
    /// deduplication in the node's scope.
    fn append_chunk(&mut self, frame: &[u8], id: &[u8; 32], shared: bool) -> Result<()>;
    /// The next chunk of the current object is one the scope holds, or one this upload sent
    /// with `shared`, of the kind named (sealed or plaintext).
    fn reference_chunk(&mut self, id: &[u8; 32], sealed: bool) -> Result<()>;
    /// Ends the current object.
    fn end_object(&mut self) -> Result<()>;
    /// Drops the current object (its file failed mid-read).
    fn abandon_object(&mut self) -> Result<()>;
    /// Marks the active version of `path` inactive (the file is gone).
    fn deactivate(&mut self, path: &[u8]) -> Result<()>;
    /// Marks the active versions of everything below `path` inactive (a directory's contents
    /// gone).
    fn deactivate_tree(&mut self, path: &[u8]) -> Result<()>;
    /// Commits everything and returns what the whole upload committed; `warnings` files were
    /// skipped or not read whole (a backup with any completed with warnings).
    fn finish(self: Box<Self>, warnings: u64) -> Result<Uploaded>;
    /// What the server last said of its work on this upload (a remote server reports it
    /// several times a second). `None` from an embedded server, whose work is the sender's
    /// own time.
    fn server_load(&self) -> Option<ServerLoad> {
        None
    }
}

/// What an upload committed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Uploaded {
    /// Objects.
    pub objects: u64,
    /// Frame bytes.
    pub bytes: u64,
}

/// One fetched frame's place; its bytes are in the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The object it belongs to.
    pub object: ObjectId,
    /// Where its raw bytes go in the file.
    pub offset: u64,
    /// How many raw bytes it holds, according to the catalog.
    pub raw_len: u32,
    /// Whether a frame is in the buffer (objects without data have none).
    pub has_frame: bool,
    /// The object's last message.
    pub last: bool,
    /// The object's data cannot be read, and why (on its last message).
    pub error: Option<String>,
    /// The chunk's keyed id, if the backup gave one.
    pub chunk_id: Option<[u8; 32]>,
}

/// Frames coming back for a restore.
pub trait Fetch: Send {
    /// The next frame into `frame` and its place, or `None` at the end.
    fn next(&mut self, frame: &mut Vec<u8>) -> Result<Option<Fetched>>;
}
