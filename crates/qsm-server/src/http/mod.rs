//! The HTTP front end (`--http-listen`, issue 27): a JSON API for administrators under
//! `/api` (described at `/api/openapi.json`) and the web console that uses it, over HTTPS
//! with the server's certificate. Like the gRPC services it only translates: every query and
//! action is an operation of the server core ([`crate::admin_core`]) run for the logged-in
//! administrator, with the same privilege checks and the same activity log.

mod api;
mod auth;
mod console;
mod files;
mod listener;
mod overview;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use qsm_types::ServerError;
use serde::Serialize;

use crate::state::State;

pub use api::ApiDoc;

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct Http {
    pub state: Arc<State>,
    /// The overview, kept a few seconds (module `overview`).
    pub overview: Arc<overview::Kept>,
}

/// An error answer: its status and a message that says what was wrong, as JSON
/// `{"error": "..."}`; never a stack of internals.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// Seconds to wait before asking again (a login lockout, a busy server).
    pub retry_after: Option<u32>,
}

/// The body of every error answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What was wrong, for a person to read.
    pub error: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), retry_after: None }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<ServerError> for ApiError {
    fn from(e: ServerError) -> ApiError {
        let status = match &e {
            ServerError::NotFound(_) => StatusCode::NOT_FOUND,
            ServerError::Exists(_) | ServerError::Refused(_) => StatusCode::CONFLICT,
            ServerError::Invalid(_) => StatusCode::BAD_REQUEST,
            ServerError::Exhausted(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServerError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            ServerError::Denied(_) => StatusCode::FORBIDDEN,
            ServerError::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
            ServerError::Cancelled(_) | ServerError::Aborted(_) => StatusCode::CONFLICT,
            ServerError::TimedOut(_) => StatusCode::GATEWAY_TIMEOUT,
            ServerError::Unreachable(_) => StatusCode::BAD_GATEWAY,
            ServerError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let retry_after = matches!(e, ServerError::Busy(_)).then_some(5);
        ApiError { status, message: e.to_string(), retry_after }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(ErrorBody { error: self.message })).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// Runs blocking work of the server core (catalog and pool calls) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ServerError> + Send + 'static,
) -> ApiResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("a server task failed: {e}"),
        )),
    }
}

/// Headers every answer carries: no framing by other sites, no MIME sniffing, no referrer
/// leaking paths, nothing an intermediary keeps.
async fn hardened(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut r = next.run(request).await;
    let h = r.headers_mut();
    for (name, value) in [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::STRICT_TRANSPORT_SECURITY, "max-age=31536000"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    h.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    r
}

/// Binds the HTTPS listener (before the server says it is ready, so a taken port fails the
/// start).
pub async fn bind(addr: &str) -> Result<(tokio::net::TcpListener, SocketAddr), ServerError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ServerError::Failed(format!("cannot listen for HTTPS on {addr}: {e}")))?;
    let local = listener.local_addr().map_err(|e| ServerError::Failed(e.to_string()))?;
    Ok((listener, local))
}

/// Serves the API and the console on `tcp` until `stopped` resolves.
pub async fn serve(
    tcp: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<State>,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let listener = listener::Listener::new(tcp, tokio_rustls::TlsAcceptor::from(tls))
        .map_err(|e| ServerError::Failed(format!("the HTTPS listener: {e}")))?;
    let http = Http { state, overview: Arc::default() };
    let app = axum::Router::new()
        .merge(console::routes())
        .nest("/api", api::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such page") })
        .layer(axum::middleware::from_fn(hardened))
        .with_state(http);
    axum::serve(listener, app.into_make_service_with_connect_info::<listener::Peer>())
        .with_graceful_shutdown(stopped)
        .await
        .map_err(|e| ServerError::Failed(format!("the HTTPS listener failed: {e}")))
}
