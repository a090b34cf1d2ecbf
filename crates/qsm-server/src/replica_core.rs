//! The target's half of node replication (issue 30): what a source server, logged in here as
//! an administrator with replication privilege, may do. It makes and updates the nodes it
//! replicates and adds their versions and data, every frame verified as it arrives; it never
//! deletes anything, and reads back only frames of the versions it sent, for a repair of the
//! source. A replicated node logs in and restores here as on its source, and backs up only
//! there.

use qsm_catalog::{FilespaceId, ObjectId, Privilege};
use qsm_proto::convert;
use qsm_proto::v1::{self, replica_op::Op};
use qsm_types::ServerError;
use qsm_types::node::UploadKind;

use crate::node_core::{NodeSession, NodeUpload, catalog_error};
use crate::state::State;

type Result<T> = std::result::Result<T, ServerError>;

/// Chunks one Frames call may ask for: a repair asks for a few at a time.
pub const FRAMES_MAX: usize = 64;
/// Longest password hash taken (an argon2id PHC string is about 100 bytes).
const HASH_MAX: usize = 512;

/// A replication account's view of this server.
#[derive(Debug)]
pub struct ReplicaSession<'a> {
    core: &'a State,
    account: String,
}

impl<'a> ReplicaSession<'a> {
    /// `account`'s session, if it may replicate: an unlocked administrator with replication
    /// (or system) privilege, read from the catalog at every call so a revocation counts at
    /// once.
    pub fn new(core: &'a State, account: &str) -> Result<ReplicaSession<'a>> {
        let admin =
            core.store.catalog().admin(account).map_err(catalog_error)?.ok_or_else(|| {
                ServerError::denied(format!("administrator {account} no longer exists"))
            })?;
        if admin.locked {
            return Err(ServerError::denied(format!("administrator {account} is locked")));
        }
        let held = &admin.privileges;
        if !held.contains(&Privilege::Replication) && !held.contains(&Privilege::System) {
            return Err(ServerError::denied(format!(
                "administrator {account} has no replication privilege: grant it with \
                 `qsm admin grant authority {account} --privilege replication`"
            )));
        }
        Ok(ReplicaSession { core, account: account.to_owned() })
    }

    /// Node `name`, which this account made: any other answers as one that does not exist.
    fn node(&self, name: &str) -> Result<NodeSession<'a>> {
        let node = self.core.store.catalog().node(name).map_err(catalog_error)?;
        match node {
            Some(n) if n.replica_of.as_deref() == Some(self.account.as_str()) => {
                Ok(NodeSession::new(self.core, n.id, None))
            }
            _ => Err(ServerError::not_found(format!(
                "no node {name} replicated by {}: send it first (PutNode)",
                self.account
            ))),
        }
    }

    /// The node's filespace `name`, created if `create`.
    fn filespace(&self, node: &NodeSession<'_>, name: &str, create: bool) -> Result<FilespaceId> {
        node.open_filespace(name, create)?
            .map(|f| f.id)
            .ok_or_else(|| ServerError::not_found(format!("no filespace {name}")))
    }

    /// Makes or updates replicated node `r.name`: its password hash, key file and dedup scope
    /// as on its source; its domain when made (the target's own if it has one of that name,
    /// else one made from the source's classes).
    pub fn put_node(&self, r: v1::ReplicaNode) -> Result<()> {
        crate::admin_core::check_name(&r.name)?;
        if !r.password_hash.starts_with("$argon2") || r.password_hash.len() > HASH_MAX {
            return Err(ServerError::invalid("a replicated node's password hash is not argon2"));
        }
        let secret: [u8; 32] = r.scope_secret.as_ref().try_into().map_err(|_| {
            ServerError::invalid(format!(
                "a dedup scope secret of {} bytes; secrets have 32",
                r.scope_secret.len()
            ))
        })?;
        let catalog = self.core.store.catalog();
        let domain = self.domain(&r)?;
        let created = catalog.node(&r.name).map_err(catalog_error)?.is_none();
        let id = catalog
            .put_replica_node(&r.name, &self.account, &r.password_hash, domain)
            .map_err(catalog_error)?;
        // The scope's name says whose it is: a source's scope never mixes with this server's
        // own nodes' or another source's, whose ids are keyed with other secrets.
        let scope = format!("replica:{}:{}", self.account, r.scope);
        let held = catalog.set_dedup_scope(id, &scope, secret).map_err(catalog_error)?;
        if held.secret != secret {
            return Err(ServerError::refused(format!(
                "dedup scope {scope} is here with another secret: its source's scope was \
                 made again; delete the replicated nodes of that scope here first"
            )));
        }
        if let Some(key) = &r.key_file {
            NodeSession::new(self.core, id, None).put_key(key)?;
        }
        if created {
            self.core.log(
                qsm_catalog::Severity::Info,
                &format!("replication account {} made replicated node {}", self.account, r.name),
                Some(id),
                None,
            );
        }
        Ok(())
    }

    /// The domain a node replicated with `r` goes into.
    fn domain(&self, r: &v1::ReplicaNode) -> Result<qsm_catalog::DomainId> {
        let catalog = self.core.store.catalog();
        if let Some(d) = catalog.domain(&r.domain).map_err(catalog_error)? {
            return Ok(d.id);
        }
        crate::admin_core::check_name(&r.domain)?;
        let id = match catalog.define_domain(&r.domain, "replicated from its source server") {
            Ok(id) => id,
            // Made by a run at the same moment.
            Err(qsm_catalog::CatalogError::Exists { .. }) => {
                return catalog
                    .domain(&r.domain)
                    .map_err(catalog_error)?
                    .map(|d| d.id)
                    .ok_or_else(|| ServerError::not_found(format!("no domain {}", r.domain)));
            }
            Err(e) => return Err(catalog_error(e)),
        };
        for c in &r.classes {
            crate::admin_core::check_name(&c.name)?;
            let backup = qsm_catalog::BackupCopyGroup {
                versions_exist: c.versions_exist,
                versions_deleted: c.versions_deleted,
                retain_extra_days: c.retain_extra_days,
                retain_only_days: c.retain_only_days,
            };
            let archive =
                qsm_catalog::ArchiveCopyGroup { retain_version_days: c.retain_version_days };
            let class =
                catalog.define_mgmt_class(id, &c.name, backup, archive).map_err(catalog_error)?;
            if c.retain_min_days > 0 {
                let days = c.retain_min_days.min(crate::admin_core::MAX_RETAIN_MIN_DAYS);
                catalog.set_retain_min(class, days).map_err(catalog_error)?;
            }
        }
        Ok(id)
    }

    /// The replicated versions of a filespace of a node this account made (the filespace is
    /// made if new): their ids on the source and whether each is active here.
    pub fn held(&self, r: &v1::HeldRequest) -> Result<Vec<(ObjectId, bool)>> {
        let node = self.node(&r.node)?;
        let fs = self.filespace(&node, &r.filespace, true)?;
        self.core.store.catalog().replica_versions(fs).map_err(catalog_error)
    }

    /// Which of `ids` the node's dedup scope holds here.
    pub fn have_chunks(&self, node: &str, ids: &[[u8; 32]], sealed: bool) -> Result<Vec<bool>> {
        self.node(node)?.have_chunks(ids, sealed)
    }

    /// Applies a Send stream's operations, `next` giving each message, until Finish: the
    /// versions committed as transactions fill, then the deactivations.
    pub fn receive(
        &self,
        next: &mut dyn FnMut() -> Result<v1::ReplicaBatch>,
    ) -> Result<v1::ReplicaSendReply> {
        let mut into: Option<Receiving<'a>> = None;
        loop {
            for op in next()?.ops {
                let op = op.op.ok_or_else(|| ServerError::invalid("an empty replica operation"))?;
                if let Op::Start(s) = &op {
                    if into.is_some() {
                        return Err(ServerError::invalid("Start sent twice"));
                    }
                    let node = self.node(&s.node)?;
                    let fs = self.filespace(&node, &s.filespace, true)?;
                    let upload = node.upload(fs, Default::default(), UploadKind::Replica)?;
                    into = Some(Receiving::new(self.core, fs, upload));
                    continue;
                }
                let r = into
                    .as_mut()
                    .ok_or_else(|| ServerError::invalid("the stream must begin with Start"))?;
                if let Op::Finish(_) = op {
                    let r = into.take().ok_or_else(|| ServerError::invalid("no Start"))?;
                    return r.finish();
                }
                r.apply(op)?;
            }
        }
    }

    /// The frames of chunks of versions this account replicated, for a repair of its source;
    /// a chunk that cannot be read comes with the reason.
    pub fn frames(&self, r: &v1::ReplicaFramesRequest) -> Result<Vec<v1::Frame>> {
        if r.chunks.len() > FRAMES_MAX {
            return Err(ServerError::invalid(format!(
                "{} chunks in one call; at most {FRAMES_MAX}",
                r.chunks.len()
            )));
        }
        let node = self.node(&r.node)?;
        let fs = self.filespace(&node, &r.filespace, false)?;
        let catalog = self.core.store.catalog();
        let mut out = Vec::with_capacity(r.chunks.len());
        for at in &r.chunks {
            let origin = ObjectId(convert::id_from_wire(at.origin, "origin").map_err(invalid)?);
            let mut frame =
                v1::Frame { object: at.origin, offset: u64::from(at.index), ..Default::default() };
            let object = catalog.object_by_origin(fs, origin).map_err(catalog_error)?;
            let chunks = match object {
                Some(id) => catalog.object_chunks(id).map_err(catalog_error)?,
                None => Vec::new(),
            };
            match chunks.get(at.index as usize) {
                None => frame.error = format!("no chunk {} of version {}", at.index, at.origin),
                Some(chunk) => {
                    let mut data = Vec::new();
                    match self.core.store.read_chunk(chunk, &mut data) {
                        Ok(_) => frame.data = data.into(),
                        Err(e) => frame.error = e.to_string(),
                    }
                    frame.raw_len = chunk.location.raw_len;
                    frame.chunk_id = chunk.hash.map(|h| h.to_vec().into()).unwrap_or_default();
                }
            }
            frame.last = true;
            out.push(frame);
        }
        Ok(out)
    }
}

fn invalid(m: convert::Malformed) -> ServerError {
    ServerError::Invalid(m.to_string())
}

/// One Send stream's filespace on its way in.
struct Receiving<'a> {
    core: &'a State,
    fs: FilespaceId,
    upload: NodeUpload<'a>,
    /// The current version's path and next chunk, for messages.
    current: (String, usize),
    deactivations: Vec<(ObjectId, qsm_catalog::Timestamp)>,
    decoder: qsm_codec::FrameDecoder,
    scratch: Vec<u8>,
}

impl<'a> Receiving<'a> {
    fn new(core: &'a State, fs: FilespaceId, upload: NodeUpload<'a>) -> Receiving<'a> {
        Receiving {
            core,
            fs,
            upload,
            current: (String::new(), 0),
            deactivations: Vec::new(),
            decoder: qsm_codec::FrameDecoder::new(),
            scratch: Vec::new(),
        }
    }

    /// Checks what can be checked of a frame without the node's key (a plaintext frame's
    /// data checksum after decoding, a sealed frame's checksum over what is sealed): a chunk
    /// damaged on the way or on the source is refused, never stored as a good copy.
    fn verify(&mut self, frame: &[u8]) -> Result<()> {
        self.decoder.verify(frame, &mut self.scratch).map_err(|e| {
            ServerError::invalid(format!(
                "replicated version {}, chunk {}: {e}; refused",
                self.current.0, self.current.1
            ))
        })?;
        self.current.1 += 1;
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<()> {
        match op {
            Op::Start(_) | Op::Finish(_) => {}
            Op::Begin(v) => {
                let origin = ObjectId(convert::id_from_wire(v.origin, "origin").map_err(invalid)?);
                let object = qsm_catalog::NewObject {
                    filespace: self.fs,
                    path: v.path.to_vec(),
                    kind: convert::kind_from_wire(v.kind).map_err(invalid)?,
                    object_type: convert::type_from_wire(v.object_type).map_err(invalid)?,
                    attrs: convert::attributes_from_wire(v.attrs.as_ref()).map_err(invalid)?,
                    mgmt_class: None,
                    description: v.description,
                    retain_until: v.retain_until,
                    chunks: Vec::new(),
                    origin: Some(origin),
                    inserted: Some(v.inserted),
                };
                self.current = (String::from_utf8_lossy(&object.path).into_owned(), 0);
                let size = object.attrs.size;
                let class = Some(v.mgmt_class.as_str()).filter(|c| !c.is_empty());
                self.upload.begin_object(object, size, class)?;
            }
            Op::Frame(frame) => {
                self.verify(&frame)?;
                self.upload.append_frame(&frame)?;
            }
            Op::Chunk(c) => {
                self.verify(&c.frame)?;
                let id =
                    crate::node::chunk_id(&c.id).map_err(|s| ServerError::invalid(s.message()))?;
                self.upload.append_chunk(&c.frame, &id, c.shared)?;
            }
            Op::Reference(r) => {
                let id =
                    crate::node::chunk_id(&r.id).map_err(|s| ServerError::invalid(s.message()))?;
                self.upload.reference_chunk(&id, r.sealed)?;
                self.current.1 += 1;
            }
            Op::End(_) => self.upload.end_object()?,
            Op::Abandon(_) => self.upload.abandon_object(),
            Op::Deactivate(d) => {
                let origin = ObjectId(convert::id_from_wire(d.origin, "origin").map_err(invalid)?);
                self.deactivations.push((origin, d.when));
            }
        }
        Ok(())
    }

    /// Commits the rest, then applies the deactivations (after the versions they name).
    fn finish(self) -> Result<v1::ReplicaSendReply> {
        let Receiving { core, fs, upload, deactivations, .. } = self;
        let done = upload.finish(0)?;
        let deactivated =
            core.store.catalog().deactivate_origins(fs, &deactivations).map_err(catalog_error)?;
        Ok(v1::ReplicaSendReply { versions: done.objects, bytes: done.bytes, deactivated })
    }
}
