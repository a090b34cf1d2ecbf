//! The writer of an [`crate::S3Pool`]: builds each container in memory and uploads it whole.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use qsm_codec::frame::FRAME_HEADER_LEN;
use qsm_pool::container::{CONTAINER_HEADER_LEN, ContainerHeader, IndexBuilder};
use qsm_pool::descriptor::random_container_id;
use qsm_pool::{ContainerId, FirstError, FrameLocation, PoolError, PoolWriter};

use crate::client;
use crate::pool::{Inner, lock, now_secs};
use qsm_pool::frames::check_appended;

/// The open container of a writer: every byte of it, since S3 has no append.
#[derive(Debug)]
struct OpenContainer {
    pool: Arc<Inner>,
    id: ContainerId,
    key: Path,
    /// The header and the frames appended so far.
    buf: Vec<u8>,
    index: IndexBuilder,
    /// How many bytes of `buf` the object in the store holds; 0 while no object exists, so
    /// the first upload is a put-if-absent.
    uploaded: usize,
}

impl Drop for OpenContainer {
    fn drop(&mut self) {
        lock(&self.pool.open).remove(&self.id);
    }
}

/// The writer of an S3 pool.
#[derive(Debug)]
pub(crate) struct S3Writer {
    pool: Arc<Inner>,
    open: Option<OpenContainer>,
    /// The id of the last container opened, for `container()` when none is open.
    last: ContainerId,
    /// The first error; after it the writer refuses to work.
    failed: FirstError,
}

impl S3Writer {
    pub(crate) fn new(pool: Arc<Inner>) -> Result<S3Writer, PoolError> {
        let mut writer = S3Writer { pool, open: None, last: 0, failed: FirstError::default() };
        writer.open_new()?;
        Ok(writer)
    }

    fn check(&self) -> Result<(), PoolError> {
        self.failed.check(&self.pool.label, self.container())
    }

    /// Records the first error, which poisons the writer.
    fn fail(&mut self, e: PoolError) -> PoolError {
        self.failed.record(e)
    }

    /// Starts a container with a fresh random id, in memory only: nothing is uploaded before
    /// it holds a frame, so a writer that never appends leaves nothing behind. That the id
    /// is new in the store is checked by the put-if-absent of its first upload.
    fn open_new(&mut self) -> Result<(), PoolError> {
        let pool = Arc::clone(&self.pool);
        for _ in 0..16 {
            let id = random_container_id()?;
            if !lock(&pool.open).insert(id) {
                continue;
            }
            let header = ContainerHeader { pool: pool.id, container: id, created: now_secs() };
            let mut buf = Vec::with_capacity(64 << 10);
            buf.extend_from_slice(&header.to_bytes());
            self.open = Some(OpenContainer {
                key: pool.container_key(id),
                pool: Arc::clone(&pool),
                id,
                buf,
                index: IndexBuilder::new(),
                uploaded: 0,
            });
            self.last = id;
            return Ok(());
        }
        Err(PoolError::Invalid(format!(
            "pool {}: 16 random container ids in a row were taken: the random source is broken",
            pool.label
        )))
    }

    /// Uploads `data` as container `c`, replacing the previous upload of it if any.
    fn upload(&self, c: &OpenContainer, op: &'static str, data: Bytes) -> Result<(), PoolError> {
        let client = &self.pool.client;
        let (store, path, create) = (Arc::clone(&client.store), c.key.clone(), c.uploaded == 0);
        let fut = client::upload(store, path, data, create, CONTAINER_HEADER_LEN);
        match client.run(op, &c.key, fut)? {
            Ok(()) => Ok(()),
            Err(e @ object_store::Error::AlreadyExists { .. }) => Err(self.pool.io_error(
                op,
                &c.key,
                format!(
                    "an object with the new container's random id already exists and was not \
                     overwritten ({e})"
                ),
            )),
            Err(e) => Err(client.error(op, &c.key, e)),
        }
    }

    /// Uploads the open container unsealed, as it is now.
    fn upload_open(&mut self) -> Result<(), PoolError> {
        let Some(c) = &self.open else { return Ok(()) };
        let len = c.buf.len();
        self.upload(c, "uploading container", Bytes::copy_from_slice(&c.buf))?;
        if let Some(c) = &mut self.open {
            c.uploaded = len;
        }
        Ok(())
    }

    /// Appends the index and trailer to the open container, uploads it and closes it. A
    /// container without frames is dropped: nothing of it was ever uploaded.
    fn seal(&mut self) -> Result<(), PoolError> {
        let Some(mut c) = self.open.take() else { return Ok(()) };
        if c.index.is_empty() {
            return Ok(());
        }
        let mut buf = std::mem::take(&mut c.buf);
        buf.extend_from_slice(&c.index.finish(c.id));
        self.upload(&c, "sealing container", Bytes::from(buf))
    }

    fn sync_inner(&mut self) -> Result<(), PoolError> {
        let Some(c) = &self.open else { return Ok(()) };
        if c.index.is_empty() || c.buf.len() == c.uploaded {
            return Ok(());
        }
        if c.buf.len() as u64 >= self.pool.sync_seal_size {
            self.seal()
        } else {
            self.upload_open()
        }
    }

    fn append_inner(
        &mut self,
        frame: &[u8],
        header: &[u8; FRAME_HEADER_LEN],
    ) -> Result<FrameLocation, PoolError> {
        let len = frame.len() as u64;
        let full = self.open.as_ref().is_none_or(|c| {
            !c.index.is_empty() && c.index.next_offset().saturating_add(len) > self.pool.target_size
        });
        if full {
            self.seal()?;
            self.open_new()?;
        }
        let Some(c) = &mut self.open else {
            return Err(PoolError::Invalid("internal error: no open container".into()));
        };
        let offset = c.index.next_offset();
        c.buf.extend_from_slice(frame);
        c.index.push(header, len);
        // MAX_FRAME_LEN is far below u32::MAX.
        Ok(FrameLocation { container: c.id, offset, len: len as u32 })
    }
}

impl PoolWriter for S3Writer {
    fn container(&self) -> ContainerId {
        self.open.as_ref().map_or(self.last, |c| c.id)
    }

    fn append(&mut self, frame: &[u8]) -> Result<FrameLocation, PoolError> {
        self.check()?;
        let header = check_appended(&self.pool.label, frame)?;
        self.append_inner(frame, &header).map_err(|e| self.fail(e))
    }

    fn sync(&mut self) -> Result<(), PoolError> {
        self.check()?;
        self.sync_inner().map_err(|e| self.fail(e))
    }

    fn finish(mut self: Box<Self>) -> Result<(), PoolError> {
        self.check()?;
        self.seal().map_err(|e| self.fail(e))
    }
}
