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
    /// The sessions opened over HTTP, per account (module `auth`).
    pub web_sessions: Arc<auth::WebSessions>,
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

/// A path parameter, or a 400 saying what was wrong with it.
pub(crate) fn path<T>(
    p: Result<axum::extract::Path<T>, axum::extract::rejection::PathRejection>,
) -> ApiResult<T> {
    p.map(|axum::extract::Path(t)| t).map_err(|e| ApiError::bad_request(e.body_text()))
}

/// A query string, or a 400 saying what was wrong with it.
pub(crate) fn query<T>(
    q: Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<T> {
    q.map(|axum::extract::Query(t)| t).map_err(|e| ApiError::bad_request(e.body_text()))
}

/// A request's JSON body: its default when there is none, else it must say it is JSON (a
/// form or text sent by mistake is refused, not taken for no options) and parse.
pub(crate) fn json_body<T: Default + serde::de::DeserializeOwned>(
    headers: &axum::http::HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> ApiResult<T> {
    let bytes = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let kind = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = kind.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("the body must be JSON (Content-Type: application/json), not {kind:?}"),
        ));
    }
    // The error names the field it found wrong, not only where in the text; `null` is no
    // options, as no body is.
    let found: Option<T> =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&bytes))
            .map_err(|e| ApiError::bad_request(format!("the body is not what this takes: {e}")))?;
    Ok(found.unwrap_or_default())
}

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
    // The API's answers are data, never a page: nothing in them may run or be framed.
    h.entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"));
    r
}

/// How long a client has to send a request's headers, counted from when the connection is
/// ready for one: a connection left idle (kept alive, or a header sent a byte at a time) is
/// closed after this, so idle connections cannot hold the listener's slots.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Serves the API and the console on `tcp` until `stopped` resolves: HTTP/1.1 only (what the
/// TLS handshake offers), each connection bounded in how long it may stay quiet.
pub async fn serve(
    tcp: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<State>,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    use axum::extract::ConnectInfo;
    use tower::ServiceExt as _;
    let mut listener = listener::Listener::new(tcp, tokio_rustls::TlsAcceptor::from(tls));
    let http = Http { state, overview: Arc::default(), web_sessions: Arc::default() };
    let app = axum::Router::new()
        .merge(console::routes())
        .nest("/api", api::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such page") })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("{method} is not allowed here"))
        })
        .layer(axum::middleware::from_fn(hardened))
        .with_state(http);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stopped);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stopped => break,
        };
        let app = app.clone().map_request(move |mut r: hyper::Request<hyper::body::Incoming>| {
            r.extensions_mut().insert(ConnectInfo(peer));
            r
        });
        let service = hyper_util::service::TowerToHyperService::new(app);
        connections.spawn(async move {
            let mut h1 = hyper::server::conn::http1::Builder::new();
            h1.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
            // A connection's end, however it came, is the client's business: nothing to log.
            let _ = h1.serve_connection(hyper_util::rt::TokioIo::new(io), service).await;
        });
        // Reap what ended, so the set holds only open connections.
        while connections.try_join_next().is_some() {}
    }
    connections.abort_all();
    Ok(())
}
