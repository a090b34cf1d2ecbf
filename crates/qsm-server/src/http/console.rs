//! The web console: one page, its script and its style, built into the binary (no install,
//! no build step: the files under `crates/qsm-server/console/` are the source). The page
//! talks to the API (module `api`) as the logged-in administrator.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::Http;

const INDEX: &str = include_str!("../../console/index.html");
const SCRIPT: &str = include_str!("../../console/console.js");
const STYLE: &str = include_str!("../../console/console.css");

/// The page's own files only: no inline script or style, no other origin, no framing.
const POLICY: &str = "default-src 'self'; style-src 'self'; img-src 'self' data:; \
                      script-src 'self'; connect-src 'self'; frame-ancestors 'none'; \
                      base-uri 'none'; form-action 'self'";

fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    // Served from memory and changed only with the binary: a short cache is enough.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The console's routes.
pub fn routes() -> axum::Router<Http> {
    axum::Router::new()
        .route("/", get(|| async { asset(INDEX, "text/html; charset=utf-8") }))
        .route("/console.js", get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }))
        .route("/console.css", get(|| async { asset(STYLE, "text/css; charset=utf-8") }))
}
