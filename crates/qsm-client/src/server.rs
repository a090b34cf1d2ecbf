//! What the client needs of a server, whether it runs in this process ([`LocalServer`], the
//! embedded default) or across a network ([`crate::remote::RemoteServer`]). Every operation acts
//! on one node's data: the node is fixed when the connection is made, so the client cannot
//! name another's filespaces, and a remote server checks that again on every request.

use qsm_catalog::{Filespace, FilespaceId, NewObject, NodeId, ObjectId, ObjectVersion};
use qsm_store::{Store, TxnLimits};

use crate::error::{ClientError, Result};

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
    /// Starts sending objects into `filespace`, committed in transactions within `limits`.
    fn upload(&self, filespace: FilespaceId, limits: TxnLimits) -> Result<Box<dyn Upload + '_>>;
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
}

/// A management class of the node's domain, as a client needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassInfo {
    /// Its name.
    pub name: String,
    /// Days it keeps archives ([`qsm_catalog::expire::NO_LIMIT`]: for ever).
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
        .map_or(qsm_catalog::ArchiveCopyGroup::default().retain_version_days, |c| c.archive_days);
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
    fn upload(&self, filespace: FilespaceId, limits: TxnLimits) -> Result<Box<dyn Upload + '_>> {
        (**self).upload(filespace, limits)
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
    /// Commits everything and returns what the whole upload committed.
    fn finish(self: Box<Self>) -> Result<Uploaded>;
    /// What the server last said of its work on this upload (a remote server reports it
    /// several times a second). `None` from an embedded server, whose work is the sender's
    /// own time.
    fn server_load(&self) -> Option<crate::adaptive::ServerLoad> {
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

/// The embedded server: a store opened in this process, acting as one node.
#[derive(Debug)]
pub struct LocalServer<'a> {
    store: &'a Store,
    node: NodeId,
    place: String,
}

impl<'a> LocalServer<'a> {
    /// `node`'s view of `store`; `place` says where it is, for messages.
    pub fn new(store: &'a Store, node: NodeId, place: impl Into<String>) -> LocalServer<'a> {
        LocalServer { store, node, place: place.into() }
    }

    fn owns(&self, filespace: FilespaceId) -> Result<bool> {
        Ok(self.store.catalog().filespaces(self.node)?.iter().any(|f| f.id == filespace))
    }

    fn scope(&self) -> Result<qsm_catalog::DedupScope> {
        let secret = qsm_crypt::random().map_err(|e| ClientError::Invalid(e.to_string()))?;
        Ok(self.store.catalog().dedup_scope(self.node, secret)?)
    }
}

impl Server for LocalServer<'_> {
    fn describe(&self) -> String {
        self.place.clone()
    }

    fn filespaces(&self) -> Result<Vec<Filespace>> {
        Ok(self.store.catalog().filespaces(self.node)?)
    }

    fn open_filespace(&self, name: &str, create: bool) -> Result<Option<FilespaceId>> {
        let catalog = self.store.catalog();
        if create {
            return Ok(Some(catalog.filespace(self.node, name)?));
        }
        Ok(catalog.filespaces(self.node)?.into_iter().find(|f| f.name == name).map(|f| f.id))
    }

    fn inventory(
        &self,
        filespace: FilespaceId,
        scope: Scope,
        f: &mut dyn FnMut(ObjectVersion) -> Result<()>,
    ) -> Result<()> {
        if !self.owns(filespace)? {
            return Err(ClientError::Invalid(format!("no filespace {}", filespace.0)));
        }
        // The catalog's callback returns catalog errors: keep the client's own aside.
        let mut failed = None;
        let mut each = |v: &ObjectVersion| match f(v.clone()) {
            Ok(()) => Ok(()),
            Err(e) => {
                failed = Some(e);
                Err(qsm_catalog::CatalogError::Refused("stopped by the client".into()))
            }
        };
        let catalog = self.store.catalog();
        let result = match scope {
            Scope::Active => catalog.for_each_active(filespace, &mut each),
            Scope::All => catalog.for_each_version(filespace, &mut each),
        };
        match (failed, result) {
            (Some(e), _) => Err(e),
            (None, r) => Ok(r?),
        }
    }

    fn object(&self, id: ObjectId) -> Result<Option<ObjectVersion>> {
        match self.store.catalog().object(id)? {
            Some(v) if self.owns(v.filespace)? => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    fn upload(&self, filespace: FilespaceId, limits: TxnLimits) -> Result<Box<dyn Upload + '_>> {
        if !self.owns(filespace)? {
            return Err(ClientError::Invalid(format!("no filespace {}", filespace.0)));
        }
        Ok(Box::new(LocalUpload {
            server: self,
            batch: self.store.batch(limits)?,
            filespace,
            scope: None,
            classes: None,
            objects: 0,
            bytes: 0,
        }))
    }

    fn fetch(&self, objects: Vec<ObjectId>) -> Result<Box<dyn Fetch + '_>> {
        let mine = self.store.catalog().filespaces(self.node)?.into_iter().map(|f| f.id).collect();
        Ok(Box::new(LocalFetch { server: self, mine, objects, next: 0, current: None }))
    }

    fn dedup_info(&self) -> Result<DedupInfo> {
        let scope = self.scope()?;
        Ok(DedupInfo {
            scope: scope.name,
            scope_secret: scope.secret,
            pool: self.store.pool().id().to_string(),
            epoch: self.store.catalog().dedup_epoch()?,
            // The embedded store has no administrator to set one: the client decides.
            dedup_default: false,
        })
    }

    fn have_chunks(&self, ids: &[[u8; 32]], sealed: bool) -> Result<Vec<bool>> {
        let scope = self.scope()?;
        let found = self.store.catalog().find_chunks(scope.id, sealed, ids)?;
        Ok(found.iter().map(Option::is_some).collect())
    }

    fn put_key(&self, key_file: &[u8]) -> Result<()> {
        Ok(self.store.catalog().set_node_key(self.node, key_file)?)
    }

    fn mgmt_classes(&self) -> Result<Vec<ClassInfo>> {
        let classes = qsm_catalog::node_classes(self.store.catalog().as_ref(), self.node)?;
        Ok(classes
            .into_iter()
            .map(|c| ClassInfo { name: c.name, archive_days: c.archive.retain_version_days })
            .collect())
    }

    fn get_key(&self) -> Result<Option<Vec<u8>>> {
        Ok(self.store.catalog().node_key(self.node)?)
    }
}

struct LocalUpload<'s> {
    server: &'s LocalServer<'s>,
    batch: qsm_store::Batch<'s>,
    filespace: FilespaceId,
    /// The node's dedup scope, looked up on first use.
    scope: Option<qsm_catalog::DedupScopeId>,
    /// The node's management classes, looked up when an object first names one.
    classes: Option<Vec<qsm_catalog::MgmtClass>>,
    objects: u64,
    bytes: u64,
}

impl LocalUpload<'_> {
    fn scope(&mut self) -> Result<qsm_catalog::DedupScopeId> {
        match self.scope {
            Some(s) => Ok(s),
            None => Ok(*self.scope.insert(self.server.scope()?.id)),
        }
    }

    fn count(&mut self, committed: Option<qsm_store::Committed>) {
        if let Some(c) = committed {
            self.objects += c.objects.len() as u64;
            self.bytes += c.bytes;
        }
    }
}

impl Upload for LocalUpload<'_> {
    fn begin_object(
        &mut self,
        mut object: NewObject,
        size_hint: u64,
        class: Option<&str>,
    ) -> Result<()> {
        object.filespace = self.filespace;
        if let Some(name) = class {
            if self.classes.is_none() {
                let catalog = self.server.store.catalog();
                self.classes = Some(qsm_catalog::node_classes(catalog.as_ref(), self.server.node)?);
            }
            object.mgmt_class =
                self.classes.iter().flatten().find(|c| c.name == name).map(|c| c.id);
        }
        let committed = self.batch.begin_object(object, size_hint, qsm_catalog::now())?;
        self.count(committed);
        Ok(())
    }

    fn append_frame(&mut self, frame: &[u8]) -> Result<()> {
        Ok(self.batch.append_frame(frame)?)
    }

    fn append_chunk(&mut self, frame: &[u8], id: &[u8; 32], shared: bool) -> Result<()> {
        let scope = if shared { Some(self.scope()?) } else { None };
        // The store reads `sealed` from the frame itself.
        let key = qsm_catalog::ChunkKey { hash: *id, scope, sealed: false };
        Ok(self.batch.append_chunk(frame, key)?)
    }

    fn reference_chunk(&mut self, id: &[u8; 32], sealed: bool) -> Result<()> {
        let scope = self.scope()?;
        Ok(self.batch.reference_chunk(*id, scope, sealed)?)
    }

    fn end_object(&mut self) -> Result<()> {
        Ok(self.batch.end_object()?)
    }

    fn abandon_object(&mut self) -> Result<()> {
        self.batch.abandon_object();
        Ok(())
    }

    fn deactivate(&mut self, path: &[u8]) -> Result<()> {
        self.batch.deactivate(self.filespace, path);
        Ok(())
    }

    fn deactivate_tree(&mut self, path: &[u8]) -> Result<()> {
        self.batch.deactivate_tree(self.filespace, path);
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<Uploaded> {
        let LocalUpload { batch, .. } = *self;
        let committed = batch.finish(qsm_catalog::now())?;
        self.objects += committed.objects.len() as u64;
        self.bytes += committed.bytes;
        Ok(Uploaded { objects: self.objects, bytes: self.bytes })
    }
}

struct LocalFetch<'a> {
    server: &'a LocalServer<'a>,
    /// The node's filespaces, read once: objects of others are refused.
    mine: std::collections::HashSet<FilespaceId>,
    objects: Vec<ObjectId>,
    next: usize,
    /// The object being read: its id, its chunks, the next chunk and the raw offset reached.
    current: Option<(ObjectId, Vec<qsm_catalog::ChunkRef>, usize, u64)>,
}

impl Fetch for LocalFetch<'_> {
    fn next(&mut self, frame: &mut Vec<u8>) -> Result<Option<Fetched>> {
        if self.current.is_none() {
            let Some(&id) = self.objects.get(self.next) else { return Ok(None) };
            self.next += 1;
            let catalog = self.server.store.catalog();
            let chunks = match catalog.object(id)? {
                Some(v) if self.mine.contains(&v.filespace) => catalog.object_chunks(id),
                _ => Err(qsm_catalog::CatalogError::Refused(format!("no object {}", id.0))),
            };
            match chunks {
                Ok(chunks) => self.current = Some((id, chunks, 0, 0)),
                Err(e) => {
                    return Ok(Some(Fetched {
                        object: id,
                        offset: 0,
                        raw_len: 0,
                        has_frame: false,
                        last: true,
                        error: Some(e.to_string()),
                        chunk_id: None,
                    }));
                }
            }
        }
        let Some((id, chunks, next, offset)) = &mut self.current else { return Ok(None) };
        let mut fetched = Fetched {
            object: *id,
            offset: *offset,
            raw_len: 0,
            has_frame: false,
            last: false,
            error: None,
            chunk_id: None,
        };
        if let Some(chunk) = chunks.get(*next) {
            match self.server.store.read_chunk(chunk, frame) {
                Ok(_) => fetched.has_frame = true,
                Err(e) => fetched.error = Some(e.to_string()),
            }
            fetched.raw_len = chunk.location.raw_len;
            fetched.chunk_id = chunk.hash;
            *offset += u64::from(chunk.location.raw_len);
            *next += 1;
        }
        if *next >= chunks.len() || fetched.error.is_some() {
            fetched.last = true;
            self.current = None;
        }
        Ok(Some(fetched))
    }
}
