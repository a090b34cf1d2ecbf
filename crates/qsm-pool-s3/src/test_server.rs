//! An S3 server in the process, for tests and benchmarks (feature `test-server`): `s3s-fs`
//! over a local directory, on a TCP port of its own, checking AWS signature v4 against one
//! fixed access key and secret key, so that requests with wrong credentials are refused as by
//! a real S3 service.
//!
//! Each bucket is a directory under the root and each object a file at `ROOT/BUCKET/KEY`
//! ([`TestServer::object_file`]), which is how tests damage stored bytes. Create buckets with
//! [`TestServer::create_bucket`] (pools do not create them).
//!
//! One deviation of `s3s-fs` from S3 is fixed here: it checks `If-None-Match: *` and then
//! writes, without excluding a concurrent write, so two racing put-if-absent requests could
//! both succeed. Conditional writes are serialised below, as S3 makes them atomic.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{S3, S3Request, S3Response, S3Result};
use s3s_fs::FileSystem;
use tokio::runtime::Runtime;

use crate::S3PoolConfig;

/// A running S3 server; it stops when dropped (its connections are closed).
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    root: PathBuf,
    access_key: String,
    secret_key: String,
    /// Always `Some` until dropped.
    runtime: Option<Runtime>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // Not a blocking shutdown: tests drop servers inside async tasks too.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl TestServer {
    /// Starts a server over the existing directory `root`, listening on `addr` (port 0: any
    /// free port; see [`TestServer::addr`]), accepting requests signed with `access_key` and
    /// `secret_key`.
    pub fn start(
        root: impl AsRef<Path>,
        addr: SocketAddr,
        access_key: &str,
        secret_key: &str,
    ) -> io::Result<TestServer> {
        let root = root.as_ref().canonicalize()?;
        let fs = FileSystem::new(&root).map_err(|e| {
            io::Error::other(format!("starting s3s-fs on {}: {e:?}", root.display()))
        })?;
        let mut builder =
            S3ServiceBuilder::new(Conditional { fs, lock: tokio::sync::Mutex::new(()) });
        builder.set_auth(SimpleAuth::from_single(access_key, secret_key));
        let service = builder.build();
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("s3-test-server")
            .enable_all()
            .build()?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        runtime.spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let socket = match listener.accept().await {
                    Ok((socket, _)) => socket,
                    Err(_) => {
                        // Out of file descriptors, most likely: wait rather than spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Responses go out as several writes (head, body chunks): without this, Nagle's
                // algorithm and the client's delayed ACKs add 40 ms to many requests.
                let _ = socket.set_nodelay(true);
                let conn =
                    http.serve_connection(TokioIo::new(socket), service.clone()).into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        Ok(TestServer {
            addr,
            root,
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            runtime: Some(runtime),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its endpoint URL, `http://ADDR`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The directory holding its buckets.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates bucket `name` (a directory under the root); an existing one is kept.
    pub fn create_bucket(&self, name: &str) -> io::Result<()> {
        if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "invalid bucket name"));
        }
        std::fs::create_dir_all(self.root.join(name))
    }

    /// The file that holds object `key` of `bucket`.
    pub fn object_file(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.join(bucket).join(key)
    }

    /// A pool configuration for `bucket` and `prefix` on this server, with its credentials,
    /// plain http, and few, short retries, so that a stopped server is reported within a
    /// couple of seconds.
    pub fn pool_config(&self, bucket: &str, prefix: &str) -> S3PoolConfig {
        S3PoolConfig {
            endpoint: Some(self.endpoint()),
            bucket: bucket.into(),
            prefix: prefix.into(),
            region: Some("us-east-1".into()),
            access_key: Some(self.access_key.clone()),
            secret_key: Some(self.secret_key.clone()),
            allow_http: true,
            max_retries: 2,
            retry_timeout_secs: 2,
            request_timeout_secs: 10,
            connect_timeout_secs: 2,
            ..S3PoolConfig::default()
        }
    }
}

/// `s3s-fs` with its conditional writes made atomic.
struct Conditional {
    fs: FileSystem,
    /// Held across a conditional write, from its check to its rename into place.
    lock: tokio::sync::Mutex<()>,
}

macro_rules! s3_impl {
    ($($op:ident: $input:ident => $output:ident),* $(,)?) => {
        #[async_trait::async_trait]
        impl S3 for Conditional {
            async fn put_object(
                &self,
                req: S3Request<PutObjectInput>,
            ) -> S3Result<S3Response<PutObjectOutput>> {
                if req.input.if_none_match.is_some() || req.input.if_match.is_some() {
                    let _guard = self.lock.lock().await;
                    return self.fs.put_object(req).await;
                }
                self.fs.put_object(req).await
            }

            async fn complete_multipart_upload(
                &self,
                req: S3Request<CompleteMultipartUploadInput>,
            ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
                if req.input.if_none_match.is_some() || req.input.if_match.is_some() {
                    let _guard = self.lock.lock().await;
                    return self.fs.complete_multipart_upload(req).await;
                }
                self.fs.complete_multipart_upload(req).await
            }

            $(
                async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.fs.$op(req).await
                }
            )*
        }
    };
}

s3_impl! {
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput,
    copy_object: CopyObjectInput => CopyObjectOutput,
    create_bucket: CreateBucketInput => CreateBucketOutput,
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput,
    delete_bucket: DeleteBucketInput => DeleteBucketOutput,
    delete_object: DeleteObjectInput => DeleteObjectOutput,
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput,
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput,
    get_object: GetObjectInput => GetObjectOutput,
    head_bucket: HeadBucketInput => HeadBucketOutput,
    head_object: HeadObjectInput => HeadObjectOutput,
    list_buckets: ListBucketsInput => ListBucketsOutput,
    list_objects: ListObjectsInput => ListObjectsOutput,
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output,
    list_parts: ListPartsInput => ListPartsOutput,
    upload_part: UploadPartInput => UploadPartOutput,
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput,
}
