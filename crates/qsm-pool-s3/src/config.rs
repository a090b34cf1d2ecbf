//! [`S3PoolConfig`]: where an S3 pool lives and how to talk to it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where an S3 pool lives and how to reach it; the server keeps it in its TOML configuration.
/// Every field has a default, so a configuration may name only the bucket:
///
/// ```toml
/// endpoint = "http://127.0.0.1:9000"
/// bucket = "qsm"
/// prefix = "pools/main"
/// allow_http = true
/// ```
///
/// Unset credentials, region and endpoint are taken from the environment as the AWS tools
/// do (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
/// `AWS_ENDPOINT`, ...; see `object_store::aws::AmazonS3Builder::from_env`); values set here
/// win. Its `Debug` output never shows the secret key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3PoolConfig {
    /// The S3 endpoint URL, e.g. `http://127.0.0.1:9000` for a local server; unset: the
    /// environment's `AWS_ENDPOINT`, else AWS's endpoint for the region.
    pub endpoint: Option<String>,
    /// The bucket, which must exist (pools do not create buckets).
    pub bucket: String,
    /// The key prefix the pool lives under (no leading or trailing `/` needed); empty: the
    /// bucket's root. One bucket holds several pools under different prefixes.
    pub prefix: String,
    /// The region; unset: the environment's, else `us-east-1`.
    pub region: Option<String>,
    /// The access key id; unset: from the environment.
    pub access_key: Option<String>,
    /// The secret access key; unset: from the environment.
    pub secret_key: Option<String>,
    /// Allow a plain-http endpoint (local test servers); otherwise only https is accepted.
    /// Only this setting counts: the environment's `AWS_ALLOW_HTTP` is not used.
    pub allow_http: bool,
    /// Address buckets as `https://BUCKET.host/` instead of `https://host/BUCKET/`. Off by
    /// default, since local S3 servers usually want path-style requests.
    pub virtual_hosted_style: bool,
    /// Retries of one request after a transient failure (a 5xx or 429 answer, a refused or
    /// reset connection, a timeout of an idempotent request), with exponential backoff from
    /// 100 ms (object_store's retry, not a loop of ours).
    pub max_retries: usize,
    /// No retry is started later than this many seconds after the first attempt, so a dead
    /// endpoint is reported within about this time (plus one request timeout).
    pub retry_timeout_secs: u64,
    /// The time limit of one HTTP request, in seconds.
    pub request_timeout_secs: u64,
    /// The time limit of establishing a connection, in seconds.
    pub connect_timeout_secs: u64,
    /// When a writer syncs a container that has reached this many bytes, it seals it and
    /// starts a new one instead of uploading it unsealed; see the crate documentation
    /// ("Syncing"). Smaller: fewer bytes uploaded again at each sync; larger: fewer, larger
    /// containers when syncs are frequent.
    pub sync_seal_size: u64,
}

/// Default of [`S3PoolConfig::sync_seal_size`].
pub const DEFAULT_SYNC_SEAL_SIZE: u64 = 8 << 20;

impl Default for S3PoolConfig {
    fn default() -> Self {
        S3PoolConfig {
            endpoint: None,
            bucket: String::new(),
            prefix: String::new(),
            region: None,
            access_key: None,
            secret_key: None,
            allow_http: false,
            virtual_hosted_style: false,
            max_retries: 6,
            retry_timeout_secs: 60,
            request_timeout_secs: 60,
            connect_timeout_secs: 5,
            sync_seal_size: DEFAULT_SYNC_SEAL_SIZE,
        }
    }
}

impl fmt::Debug for S3PoolConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let S3PoolConfig {
            endpoint,
            bucket,
            prefix,
            region,
            access_key,
            secret_key,
            allow_http,
            virtual_hosted_style,
            max_retries,
            retry_timeout_secs,
            request_timeout_secs,
            connect_timeout_secs,
            sync_seal_size,
        } = self;
        f.debug_struct("S3PoolConfig")
            .field("endpoint", endpoint)
            .field("bucket", bucket)
            .field("prefix", prefix)
            .field("region", region)
            .field("access_key", access_key)
            .field("secret_key", &secret_key.as_ref().map(|_| "<redacted>"))
            .field("allow_http", allow_http)
            .field("virtual_hosted_style", virtual_hosted_style)
            .field("max_retries", max_retries)
            .field("retry_timeout_secs", retry_timeout_secs)
            .field("request_timeout_secs", request_timeout_secs)
            .field("connect_timeout_secs", connect_timeout_secs)
            .field("sync_seal_size", sync_seal_size)
            .finish()
    }
}
