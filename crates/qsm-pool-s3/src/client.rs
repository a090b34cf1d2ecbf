//! The connection to the object store: an `object_store` S3 client, the private runtime its
//! futures run on, and the mapping of its errors to [`PoolError`]s that name the endpoint,
//! bucket, key and operation.

use std::future::Future;
use std::io::{self, ErrorKind};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
use object_store::client::HttpError;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode,
    PutOptions, PutPayload, RetryConfig, WriteMultipart,
};
use qsm_pool::PoolError;
use tokio::runtime::{Handle, Runtime};

use crate::config::S3PoolConfig;

/// Objects above this size are uploaded in parts (multipart upload).
pub const MULTIPART_THRESHOLD: usize = 8 << 20;
/// The size of one part of a multipart upload (S3 wants at least 5 MiB but the last).
const PART_SIZE: usize = 8 << 20;
/// Parts of one upload in flight at once.
const PART_CONCURRENCY: usize = 4;

pub(crate) type StoreResult<T> = Result<T, object_store::Error>;

/// The S3 client of one pool and the runtime its requests run on.
///
/// The pool's trait is synchronous and is called from plain threads, from `spawn_blocking`
/// threads and from async tasks of other runtimes. `Runtime::block_on` panics in the last
/// case, so every request is spawned onto this private runtime and its `JoinHandle` waited
/// for with `futures::executor::block_on`, which parks any thread.
pub(crate) struct Client {
    pub(crate) store: Arc<AmazonS3>,
    /// Always `Some` until dropped; taken in `drop` to shut it down without blocking.
    runtime: Option<Runtime>,
    handle: Handle,
    pub(crate) bucket: String,
    /// Where the pool lives, for messages: `ENDPOINT/BUCKET/PREFIX` or `s3://BUCKET/PREFIX`.
    pub(crate) location: String,
    /// `ENDPOINT/BUCKET` or `s3://BUCKET`: object keys are appended to it in messages.
    base: String,
    pub(crate) endpoint: String,
    pub(crate) prefix: Path,
    pub(crate) sync_seal_size: u64,
}

impl std::fmt::Debug for Client {
    // The store's own Debug output includes its configuration; not printed, so that no
    // credential can reach a log through it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("location", &self.location).finish_non_exhaustive()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Dropping a runtime blocks until its workers stop, which panics when the last pool
        // handle goes away inside an async task; nothing of ours is pending by then.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn invalid(detail: String) -> PoolError {
    PoolError::Invalid(detail)
}

impl Client {
    pub(crate) fn new(config: &S3PoolConfig) -> Result<Client, PoolError> {
        if config.bucket.is_empty() {
            return Err(invalid("S3 pool configuration: the bucket is not set".into()));
        }
        let prefix = config.prefix.trim_matches('/');
        let prefix = Path::parse(prefix).map_err(|e| {
            invalid(format!("S3 pool configuration: invalid prefix {:?}: {e}", config.prefix))
        })?;
        if let Some(endpoint) = &config.endpoint
            && endpoint.starts_with("http://")
            && !config.allow_http
        {
            return Err(invalid(format!(
                "S3 pool configuration: the endpoint {endpoint} is plain http, which needs \
                 allow_http = true"
            )));
        }
        let options = ClientOptions::new()
            .with_allow_http(config.allow_http)
            .with_timeout(Duration::from_secs(config.request_timeout_secs.max(1)))
            .with_connect_timeout(Duration::from_secs(config.connect_timeout_secs.max(1)));
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(10),
                base: 2.0,
            },
            max_retries: config.max_retries,
            retry_timeout: Duration::from_secs(config.retry_timeout_secs),
        };
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&config.bucket)
            .with_client_options(options)
            .with_retry(retry)
            .with_virtual_hosted_style_request(config.virtual_hosted_style)
            // Put-if-absent with `If-None-Match: *`, which AWS S3 and the usual S3 servers
            // support; pool creation and new container ids rely on it.
            .with_conditional_put(S3ConditionalPut::ETagMatch);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(region) = &config.region {
            builder = builder.with_region(region);
        }
        match (&config.access_key, &config.secret_key) {
            (Some(key), Some(secret)) => {
                builder = builder.with_access_key_id(key).with_secret_access_key(secret);
            }
            (None, None) => {}
            _ => {
                return Err(invalid(
                    "S3 pool configuration: set both access_key and secret_key, or neither \
                     (then they come from the environment)"
                        .into(),
                ));
            }
        }
        let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
        let base = match &endpoint {
            Some(e) => format!("{}/{}", e.trim_end_matches('/'), config.bucket),
            None => format!("s3://{}", config.bucket),
        };
        let endpoint = endpoint.unwrap_or_else(|| "AWS S3".into());
        let location =
            if prefix.as_ref().is_empty() { base.clone() } else { format!("{base}/{prefix}") };
        let store = builder.build().map_err(|e| {
            invalid(format!("S3 pool configuration for {location} is not usable: {e}"))
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("qsm-pool-s3")
            .enable_all()
            .build()
            .map_err(|source| PoolError::Io {
                op: "starting the I/O threads of the S3 pool at",
                path: location.clone().into(),
                source,
            })?;
        Ok(Client {
            store: Arc::new(store),
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
            bucket: config.bucket.clone(),
            location,
            base,
            endpoint,
            prefix,
            sync_seal_size: config.sync_seal_size,
        })
    }

    /// The key `name` under the pool's prefix.
    pub(crate) fn key(&self, parts: &[&str]) -> Path {
        parts.iter().fold(self.prefix.clone(), |p, part| p.join(*part))
    }

    /// How messages name an object.
    pub(crate) fn url(&self, key: &Path) -> PathBuf {
        format!("{}/{key}", self.base).into()
    }

    /// Runs `fut` on the pool's runtime and waits for it from whatever thread calls.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        op: &'static str,
        key: &Path,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, PoolError> {
        futures::executor::block_on(self.handle.spawn(fut)).map_err(|e| PoolError::Io {
            op,
            path: self.url(key),
            source: io::Error::other(format!("the request task failed: {e}")),
        })
    }

    /// The pool error for a failed request, naming the operation and the object (endpoint,
    /// bucket and key), with a hint for what an administrator can fix.
    pub(crate) fn error(&self, op: &'static str, key: &Path, e: object_store::Error) -> PoolError {
        let (kind, hint) = match classify(&e) {
            Class::NoBucket => (
                ErrorKind::NotFound,
                format!(
                    "bucket '{}' does not exist at {} (pools do not create buckets): ",
                    self.bucket, self.endpoint
                ),
            ),
            Class::NotFound => (ErrorKind::NotFound, String::new()),
            Class::Denied => (
                ErrorKind::PermissionDenied,
                format!(
                    "access denied by {} (check the access key and secret key, and their \
                     permissions on bucket '{}'): ",
                    self.endpoint, self.bucket
                ),
            ),
            Class::Exists => (ErrorKind::AlreadyExists, String::new()),
            Class::Transport => (
                ErrorKind::Other,
                format!(
                    "cannot reach {} (bucket '{}'; {}): ",
                    self.endpoint,
                    self.bucket,
                    root_cause(&e)
                ),
            ),
            Class::Other => (ErrorKind::Other, String::new()),
        };
        PoolError::Io {
            op,
            path: self.url(key),
            source: io::Error::new(kind, format!("{hint}{e}")),
        }
    }
}

/// What kind of failure an object_store error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    NoBucket,
    NotFound,
    Denied,
    Exists,
    Transport,
    Other,
}

/// S3 error codes that mean the credentials or their permissions were refused.
const DENIED_CODES: &[&str] = &[
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
];

pub(crate) fn classify(e: &object_store::Error) -> Class {
    use object_store::Error as E;
    // object_store maps statuses to variants for object requests only (a failed listing is
    // `Generic`), and 404 means a missing key or a missing bucket; the S3 error code in the
    // answer's body, which object_store keeps in the message, tells them apart.
    let text = e.to_string();
    let code = s3_code(&text);
    if code == Some("NoSuchBucket") {
        return Class::NoBucket;
    }
    match e {
        E::NotFound { .. } => Class::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Class::Denied,
        E::AlreadyExists { .. } | E::Precondition { .. } => Class::Exists,
        _ if code.is_some_and(|c| DENIED_CODES.contains(&c)) => Class::Denied,
        _ if is_transport(e) => Class::Transport,
        _ => Class::Other,
    }
}

/// The S3 error code (`<Code>NoSuchBucket</Code>`) in an error message, if any.
fn s3_code(text: &str) -> Option<&str> {
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    Some(&text[start..start + len])
}

/// The innermost error of `e`'s sources ("Connection refused"), which object_store's own
/// message leaves out.
fn root_cause(e: &object_store::Error) -> String {
    let mut cause: &(dyn std::error::Error + 'static) = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// Whether the request failed in transport (no HTTP answer: refused, reset, timed out), as
/// opposed to an answer with an error status.
pub(crate) fn is_transport(e: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<HttpError>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Whether the object does not exist (its bucket does).
pub(crate) fn is_not_found(e: &object_store::Error) -> bool {
    classify(e) == Class::NotFound
}

/// The bytes of `range` of object `path`, cut at the end of the object, and the object's
/// size. A range starting at or past the end gives no bytes (S3 answers 416 there; a HEAD
/// then tells that from other errors).
pub(crate) async fn get_range(
    store: Arc<AmazonS3>,
    path: Path,
    range: Range<u64>,
) -> StoreResult<(Bytes, u64)> {
    let options =
        GetOptions { range: Some(GetRange::Bounded(range.clone())), ..Default::default() };
    match store.get_opts(&path, options).await {
        Ok(result) => {
            let size = result.meta.size;
            let expected = result.range.end - result.range.start;
            let bytes = result.bytes().await?;
            if bytes.len() as u64 != expected {
                return Err(object_store::Error::Generic {
                    store: "S3",
                    source: format!(
                        "{} bytes received for a range of {expected} bytes",
                        bytes.len()
                    )
                    .into(),
                });
            }
            Ok((bytes, size))
        }
        Err(e) if is_not_found(&e) || is_transport(&e) => Err(e),
        Err(e) => match store.head(&path).await {
            Ok(meta) if meta.size <= range.start => Ok((Bytes::new(), meta.size)),
            Err(head) if is_not_found(&head) => Err(head),
            _ => Err(e),
        },
    }
}

/// Uploads `data` as object `path`: put-if-absent when `create`, else replacing it; in parts
/// when large. A multipart upload cannot be conditional, so a large object that must not
/// replace anything is first claimed by a put-if-absent of `claim` (its first bytes).
pub(crate) async fn upload(
    store: Arc<AmazonS3>,
    path: Path,
    data: Bytes,
    create: bool,
    claim_len: usize,
) -> StoreResult<()> {
    if data.len() <= MULTIPART_THRESHOLD {
        let mode = if create { PutMode::Create } else { PutMode::Overwrite };
        return put(&store, &path, data, mode).await;
    }
    if create {
        put(&store, &path, data.slice(..claim_len.min(data.len())), PutMode::Create).await?;
    }
    let upload = store.put_multipart(&path).await?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
    let mut at = 0;
    while at < data.len() {
        let end = (at + PART_SIZE).min(data.len());
        if let Err(e) = writer.wait_for_capacity(PART_CONCURRENCY).await {
            // Best effort: an upload left incomplete costs storage until a lifecycle rule
            // removes it, and the error that matters is the one being returned.
            let _ = writer.abort().await;
            return Err(e);
        }
        writer.put(data.slice(at..end));
        at = end;
    }
    writer.finish().await.map(|_| ())
}

/// One PUT. A put-if-absent that finds the object already holding exactly `data` succeeded:
/// that is what an earlier attempt of the same request whose answer was lost leaves behind
/// (object_store retries a PUT after a 5xx answer).
async fn put(store: &AmazonS3, path: &Path, data: Bytes, mode: PutMode) -> StoreResult<()> {
    let create = matches!(mode, PutMode::Create);
    let options = PutOptions { mode, ..Default::default() };
    match store.put_opts(path, PutPayload::from_bytes(data.clone()), options).await {
        Ok(_) => Ok(()),
        Err(e @ object_store::Error::AlreadyExists { .. }) if create => {
            match store.get(path).await {
                Ok(existing) if existing.meta.size == data.len() as u64 => {
                    match existing.bytes().await {
                        Ok(bytes) if bytes == data => Ok(()),
                        _ => Err(e),
                    }
                }
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}
