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
/// The largest key file kept, as for a node's own (`node_core`).
const KEY_FILE_MAX: usize = 4096;
/// Refused versions named to the source, per stream.
const REFUSALS_TOLD: usize = 1_000;
/// Deactivations applied in one transaction.
const DEACTIVATIONS_PER_TXN: usize = 10_000;

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

    /// Makes or updates replicated node `r.name`: its password hash, lock and dedup scope as
    /// on its source; its key file and domain when made (the target's domain of that name if
    /// it has one, else one made from the source's classes).
    pub fn put_node(&self, r: v1::ReplicaNode) -> Result<()> {
        crate::admin_core::check_name(&r.name)?;
        if !crate::auth::acceptable_hash(&r.password_hash) {
            return Err(ServerError::invalid(
                "a replicated node's password hash must be argon2id, costing no more than this \
                 server's own",
            ));
        }
        let secret: [u8; 32] = r.scope_secret.as_ref().try_into().map_err(|_| {
            ServerError::invalid(format!(
                "a dedup scope secret of {} bytes; secrets have 32",
                r.scope_secret.len()
            ))
        })?;
        if r.key_file.as_ref().is_some_and(|k| k.is_empty() || k.len() > KEY_FILE_MAX) {
            return Err(ServerError::invalid("a key file of 1 to 4096 bytes"));
        }
        let catalog = self.core.store.catalog();
        let existing = catalog.node(&r.name).map_err(catalog_error)?;
        if let Some(n) = &existing
            && n.replica_of.as_deref() != Some(self.account.as_str())
        {
            return Err(ServerError::exists(format!(
                "node {} is here and is not a replica made by {}",
                r.name, self.account
            )));
        }
        let domain = match &existing {
            Some(n) => n.domain,
            None => self.domain(&r)?,
        };
        let id = catalog
            .put_replica_node(&r.name, &self.account, &r.password_hash, domain, r.incarnation)
            .map_err(catalog_error)?;
        if existing.as_ref().is_none_or(|n| n.locked != r.locked) {
            catalog.set_node_locked(id, r.locked).map_err(catalog_error)?;
        }
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
        // The key file is kept as first sent: a source in the wrong hands must not replace
        // it with one nobody can open.
        if let Some(key) = &r.key_file
            && catalog.node_key(id).map_err(catalog_error)?.is_none()
        {
            catalog.set_node_key(id, key).map_err(catalog_error)?;
        }
        if existing.is_none() {
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
        // Every class checked as `define mgmtclass` checks it, before anything is made.
        crate::admin_core::check_name(&r.domain)?;
        let mut classes = Vec::with_capacity(r.classes.len());
        for c in &r.classes {
            crate::admin_core::check_name(&c.name)?;
            let asked = v1::MgmtClassRequest {
                domain: r.domain.clone(),
                name: c.name.clone(),
                versions_exist: Some(c.versions_exist),
                versions_deleted: Some(c.versions_deleted),
                retain_extra_days: Some(c.retain_extra_days),
                retain_only_days: Some(c.retain_only_days),
                retain_version_days: Some(c.retain_version_days),
                retain_min_days: Some(c.retain_min_days),
            };
            let (backup, archive) = crate::admin_core::copy_groups(&asked, Default::default())?;
            let days = c.retain_min_days.min(crate::admin_core::MAX_RETAIN_MIN_DAYS);
            classes.push((&c.name, backup, archive, days));
        }
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
        for (name, backup, archive, days) in classes {
            let class =
                catalog.define_mgmt_class(id, name, backup, archive).map_err(catalog_error)?;
            if days > 0 {
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
    /// The current version's path, next chunk and source id, for messages.
    current: (String, usize, u64),
    /// The current version was refused: its chunks are skipped until its End.
    refused: bool,
    /// What was refused, told to the source (the first [`REFUSALS_TOLD`]), and how many more.
    refusals: Vec<String>,
    more_refused: u64,
    deactivations: Vec<(ObjectId, qsm_catalog::Timestamp)>,
    deactivated: u64,
    decoder: qsm_codec::FrameDecoder,
    scratch: Vec<u8>,
}

impl<'a> Receiving<'a> {
    fn new(core: &'a State, fs: FilespaceId, upload: NodeUpload<'a>) -> Receiving<'a> {
        Receiving {
            core,
            fs,
            upload,
            current: (String::new(), 0, 0),
            refused: false,
            refusals: Vec::new(),
            more_refused: 0,
            deactivations: Vec::new(),
            deactivated: 0,
            decoder: qsm_codec::FrameDecoder::new(),
            scratch: Vec::new(),
        }
    }

    /// Checks what can be checked of a frame without the node's key (a plaintext frame's
    /// data checksum after decoding, a sealed frame's checksum over what is sealed): a chunk
    /// damaged on the way or on the source is refused, never stored as a good copy.
    fn verify(&mut self, frame: &[u8]) -> Result<()> {
        self.decoder.verify(frame, &mut self.scratch).map_err(|e| {
            ServerError::invalid(format!("the frame is damaged ({e}): audit the source's pool"))
        })?;
        self.current.1 += 1;
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<()> {
        match op {
            Op::Start(_) | Op::Finish(_) => Ok(()),
            Op::Begin(v) => {
                self.refused = false;
                let r = self.begin(v);
                self.settle(r)
            }
            _ if self.refused && !matches!(op, Op::End(_) | Op::Abandon(_) | Op::Deactivate(_)) => {
                Ok(())
            }
            Op::Frame(frame) => {
                let r = self.verify(&frame).and_then(|()| self.upload.append_frame(&frame));
                self.settle(r)
            }
            Op::Chunk(c) => {
                let r = self.verify(&c.frame).and_then(|()| {
                    let id = crate::node::chunk_id(&c.id)
                        .map_err(|s| ServerError::invalid(s.message()))?;
                    self.upload.append_chunk(&c.frame, &id, c.shared)
                });
                self.settle(r)
            }
            Op::Reference(r) => {
                let r = crate::node::chunk_id(&r.id)
                    .map_err(|s| ServerError::invalid(s.message()))
                    .and_then(|id| self.upload.reference_chunk(&id, r.sealed));
                self.current.1 += 1;
                self.settle(r)
            }
            Op::End(_) if std::mem::take(&mut self.refused) => Ok(()),
            Op::End(_) => self.upload.end_object(),
            Op::Abandon(_) => {
                self.refused = false;
                self.upload.abandon_object();
                Ok(())
            }
            Op::Deactivate(d) => {
                let origin = ObjectId(convert::id_from_wire(d.origin, "origin").map_err(invalid)?);
                self.deactivations.push((origin, d.when));
                if self.deactivations.len() >= DEACTIVATIONS_PER_TXN {
                    self.deactivate()?;
                }
                Ok(())
            }
        }
    }

    fn begin(&mut self, v: v1::ReplicaVersion) -> Result<()> {
        self.current = (String::from_utf8_lossy(&v.path).into_owned(), 0, v.origin);
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
            replica: Some(qsm_catalog::Replicated {
                origin,
                inserted: v.inserted,
                deactivated: v.deactivated,
            }),
        };
        let size = object.attrs.size;
        let class = Some(v.mgmt_class.as_str()).filter(|c| !c.is_empty());
        self.upload.begin_object(object, size, class).map(|_| ())
    }

    /// A refusal of what one version holds (a corrupt frame, a path or attribute out of
    /// bounds, a chunk reference this server cannot resolve) drops that version and is told to
    /// the source, so the versions after it still arrive; anything else (the pool, the
    /// catalog) ends the stream.
    fn settle(&mut self, r: Result<()>) -> Result<()> {
        match r {
            Err(ServerError::Invalid(why) | ServerError::Refused(why)) => {
                self.upload.abandon_object();
                self.refused = true;
                if self.refusals.len() < REFUSALS_TOLD {
                    let (path, chunk, origin) = &self.current;
                    self.refusals.push(format!("version {origin} ({path}), chunk {chunk}: {why}"));
                } else {
                    self.more_refused += 1;
                }
                Ok(())
            }
            other => other,
        }
    }

    /// Applies the deactivations received so far: they name versions committed in earlier
    /// runs, so they need not wait for this stream's commits.
    fn deactivate(&mut self) -> Result<()> {
        let catalog = self.core.store.catalog();
        let n = catalog.deactivate_origins(self.fs, &self.deactivations).map_err(catalog_error)?;
        self.deactivated += n;
        self.deactivations.clear();
        Ok(())
    }

    /// Commits the rest and applies the last deactivations.
    fn finish(self) -> Result<v1::ReplicaSendReply> {
        let Receiving {
            core,
            fs,
            upload,
            deactivations,
            mut deactivated,
            mut refusals,
            more_refused,
            ..
        } = self;
        let done = upload.finish(0)?;
        let catalog = core.store.catalog();
        deactivated += catalog.deactivate_origins(fs, &deactivations).map_err(catalog_error)?;
        if more_refused > 0 {
            refusals.push(format!("and {more_refused} more versions refused"));
        }
        Ok(v1::ReplicaSendReply {
            versions: done.objects,
            bytes: done.bytes,
            deactivated,
            refused: refusals,
        })
    }
}
