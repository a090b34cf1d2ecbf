//! # qsm-proto: the QSM wire protocol
//!
//! gRPC services generated from `proto/qsm/v1/qsm.proto` (see `docs/PROTOCOL.md`). The
//! protocol number a client sends at login is [`PROTOCOL`].

#![allow(missing_docs, clippy::all, missing_debug_implementations)]

/// Version 1 of the protocol.
pub mod v1 {
    tonic::include_proto!("qsm.v1");
}

/// The protocol version this build speaks. 2: object types FIFO, character and block device
/// and hard link (issue 22), which protocol-1 peers refuse as unknown enum values, so the
/// peers of another protocol are refused at login instead of failing mid-restore.
pub const PROTOCOL: u32 = 2;

/// The metadata key of a refusal that may be retried: the seconds to wait first. Only the
/// server's "busy with logins" carries it (a lockout does not: asking again changes nothing).
pub const RETRY_AFTER: &str = "retry-after";

/// The largest gRPC message either side accepts: a 16 MiB quantum's frame plus room for the
/// operations batched with it. Larger messages are refused before they are allocated.
pub const MAX_MESSAGE: usize = 17 * 1024 * 1024 + 64 * 1024;

mod admin;
/// A channel's endpoint as every QSM peer dials one (a client to its server, a server to its
/// replication target): a bounded connect, keepalives that find a vanished peer, and large
/// HTTP/2 windows, so one stream fills a fast link with megabyte frames.
pub fn endpoint(url: &str) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    use std::time::Duration;
    Ok(tonic::transport::Endpoint::from_shared(url.to_owned())?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20))
        .initial_stream_window_size(8 << 20)
        .initial_connection_window_size(16 << 20))
}

/// Adds a session's token (`Bearer TOKEN`) to every call; `None` before a login, or on the
/// local socket, which needs none.
#[derive(Debug, Clone)]
pub struct Bearer(pub Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request.metadata_mut().insert("authorization", token.clone());
        }
        Ok(request)
    }
}

pub mod convert;
pub mod pem;
pub mod reports;
pub mod status;

pub use admin::{Admin, AdminApi, CopyGroups};

/// Whether `host` (as a URL or a listen address names it, IPv6 in brackets or not) is this
/// machine's loopback, where a connection without TLS never leaves the machine. The client
/// refuses `http://` elsewhere and the server `--plaintext` elsewhere, both by this rule.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Checks that a peer answered each of `asked` questions of a batch (chunk ids it holds...):
/// an answer cut short or padded is the peer's fault, named, never silently zipped short.
pub fn check_answers(
    peer: &str,
    answers: usize,
    asked: usize,
    what: &str,
) -> Result<(), qsm_types::ServerError> {
    if answers == asked {
        return Ok(());
    }
    Err(qsm_types::ServerError::Failed(format!("{peer}: {answers} answers to {asked} {what}")))
}
