//! Who calls the HTTP API: a session opened by `POST /api/login` (the same logins, lockouts
//! and sessions as the gRPC front end, module `login`), named by a bearer token or by the
//! console's cookie.
//!
//! CSRF: the cookie is `SameSite=Strict`, and a request that changes anything with it must
//! also carry the `X-QSM-CSRF` header, which another site's page cannot add without a CORS
//! preflight this server never grants; its `Origin`, when sent, must be this server's. A
//! bearer token is never sent by a browser on its own, so it needs neither.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, FromRequestParts, State as Extract};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiResult, ErrorBody, Http, blocking, json_body};
use crate::admin_core::Actor;
use crate::auth::Session;
use crate::login::LoginAttempt;

/// The console's session cookie. The `__Host-` prefix makes browsers take it only from this
/// host, over HTTPS, for every path: a neighbouring site cannot plant one that shadows it.
pub const COOKIE: &str = "__Host-qsm_session";
/// Sessions one account keeps open over HTTP: a script that logs in again and again without
/// logging out closes its own oldest, instead of filling the server's sessions.
const WEB_SESSIONS_PER_ACCOUNT: usize = 8;
/// The header a cookie-authenticated change must carry.
pub const CSRF_HEADER: &str = "x-qsm-csrf";
/// How long a login waits for its turn among password checks.
const LOGIN_PATIENCE: Duration = Duration::from_secs(10);

/// A logged-in caller: an administrator or a node.
pub struct Caller {
    pub session: Arc<Session>,
    token: String,
}

/// A logged-in administrator, as the server core names it.
pub struct AdminCaller(pub Actor);

/// The session token of a request, and whether it came in the cookie.
fn token_of(headers: &HeaderMap) -> Option<(String, bool)> {
    // The scheme's name is case-insensitive (RFC 9110 11.1).
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| {
        let (scheme, token) = v.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then_some(token)
    });
    if let Some(t) = bearer {
        return Some((t.trim().to_owned(), false));
    }
    let cookies = headers.get_all(header::COOKIE).into_iter().filter_map(|v| v.to_str().ok());
    cookies
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| (value.to_owned(), true))
}

/// Refuses a cookie-authenticated change another site's page could have made.
fn check_csrf(parts: &Parts) -> ApiResult<()> {
    if matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let forbidden = |why: &str| ApiError::new(StatusCode::FORBIDDEN, why);
    if !parts.headers.contains_key(CSRF_HEADER) {
        return Err(forbidden(
            "a change made with the session cookie needs the X-QSM-CSRF header \
             (protection against requests forged by other sites)",
        ));
    }
    let host = parts.headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let Some(origin) = parts.headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        if host.is_none_or(|h| origin != format!("https://{h}")) {
            return Err(forbidden("a change from another site's page (its Origin) is refused"));
        }
    }
    Ok(())
}

impl FromRequestParts<Http> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, http: &Http) -> ApiResult<Caller> {
        let unauthenticated = |why: &str| ApiError::new(StatusCode::UNAUTHORIZED, why);
        let Some((token, by_cookie)) = token_of(&parts.headers) else {
            return Err(unauthenticated(
                "log in first: POST /api/login, then send the session cookie or \
                 `Authorization: Bearer TOKEN`",
            ));
        };
        if by_cookie {
            check_csrf(parts)?;
        }
        let session = http
            .state
            .sessions
            .get(&token, None)
            .ok_or_else(|| unauthenticated("not logged in, or the session expired"))?;
        if session.is_cancelled() {
            return Err(unauthenticated(&format!(
                "session {} was cancelled by an administrator",
                session.id
            )));
        }
        Ok(Caller { session, token })
    }
}

impl FromRequestParts<Http> for AdminCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, http: &Http) -> ApiResult<AdminCaller> {
        let caller = Caller::from_request_parts(parts, http).await?;
        if caller.session.node.is_some() {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "a node cannot administer the server: log in as an administrator",
            ));
        }
        Ok(AdminCaller(Actor::Admin(caller.session.account.clone())))
    }
}

/// `POST /api/login`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// The administrator's (or node's) name.
    pub name: String,
    pub password: String,
    /// Log in as a node rather than an administrator.
    #[serde(default)]
    pub node: bool,
    /// Keep the session in an HttpOnly cookie (a browser's page) rather than answer with its
    /// token (a script), so a page's script never holds the token.
    #[serde(default)]
    pub cookie: bool,
}

/// The sessions each account opened over HTTP, oldest first.
#[derive(Debug, Default)]
pub struct WebSessions(std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>);

impl WebSessions {
    /// Records `token` as `account`'s newest; returns the tokens past the bound, to close.
    fn opened(&self, account: &str, token: &str) -> Vec<String> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mine = all.entry(account.to_owned()).or_default();
        mine.push(token.to_owned());
        let excess = mine.len().saturating_sub(WEB_SESSIONS_PER_ACCOUNT);
        mine.drain(..excess).collect()
    }

    fn closed(&self, account: &str, token: &str) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mine) = all.get_mut(account) {
            mine.retain(|t| t != token);
            if mine.is_empty() {
                all.remove(account);
            }
        }
    }
}

/// Who is logged in.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Whoami {
    pub account: String,
    /// An administrator's session (else a node's).
    pub admin: bool,
    /// The session's number, as `query session` lists it.
    pub session: u64,
    /// The bearer token (in the login's answer only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

fn session_cookie(token: &str, max_age: Option<u32>) -> HeaderValue {
    let age = max_age.map_or_else(String::new, |s| format!("; Max-Age={s}"));
    let cookie = format!("{COOKIE}={token}; Path=/; Secure; HttpOnly; SameSite=Strict{age}");
    // A token is URL-safe text; should it ever not be, no cookie rather than a bad header.
    HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Logs in and opens a session: its token in the answer, or (`cookie`) in an HttpOnly cookie.
#[utoipa::path(post, path = "/api/login", tag = "session", request_body = LoginRequest,
    responses(
        (status = 200, description = "Logged in", body = Whoami),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Wrong name or password", body = ErrorBody),
        (status = 403, description = "The account is locked", body = ErrorBody),
        (status = 429, description = "Locked out after failed logins", body = ErrorBody),
        (status = 503, description = "Busy checking other logins", body = ErrorBody),
    ))]
pub async fn login(
    Extract(http): Extract<Http>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let r: LoginRequest = json_body(&headers, body)?;
    // The session list names the program: the first word of its user agent is enough.
    let agent = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let agent = agent.split_whitespace().next().unwrap_or("unknown");
    let mut attempt = LoginAttempt {
        account: r.name,
        password: r.password,
        admin: !r.node,
        client: format!("HTTP API ({agent})"),
        peer: peer.to_string(),
        conn: None,
    };
    // A lockout's answer says how long it lasts, in its text and in Retry-After alike: both
    // from the lockout table's one reading.
    let counted = crate::login::login_keys(&attempt);
    let locked_out = |l: crate::logins::LockedOut| ApiError {
        status: StatusCode::TOO_MANY_REQUESTS,
        message: l.to_string(),
        retry_after: Some(u32::try_from(l.wait.as_secs().max(1)).unwrap_or(u32::MAX)),
    };
    if let Some(l) = http.state.logins.lockout(&counted) {
        return Err(locked_out(l));
    }
    // Locked out while it waited for its turn (module `login` checks again then).
    let with_wait = |e: ApiError| match http.state.logins.lockout(&counted) {
        Some(l) if e.status == StatusCode::TOO_MANY_REQUESTS => locked_out(l),
        _ => e,
    };
    let keys = http.state.login_allowed(&mut attempt)?;
    let cookie = r.cookie;
    let Some(_turn) = http.state.logins.turn(LOGIN_PATIENCE).await else {
        let mut busy = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is busy checking other logins: try again in a few seconds",
        );
        busy.retry_after = Some(2);
        return Err(busy);
    };
    let state = Arc::clone(&http.state);
    let (session, token) = blocking(move || state.login(attempt, keys)).await.map_err(with_wait)?;
    let evicted = http.web_sessions.opened(&session.account, &token);
    if !evicted.is_empty() {
        let state = Arc::clone(&http.state);
        blocking(move || {
            for old in evicted.iter().filter_map(|t| state.sessions.close(t)) {
                state.end_record(&old, "ended: too many web sessions of its account (newest kept)");
            }
            Ok(())
        })
        .await?;
    }
    let me = Whoami {
        account: session.account.clone(),
        admin: session.node.is_none(),
        session: session.id,
        token: (!cookie).then(|| token.clone()),
    };
    let mut answer = Json(me).into_response();
    if cookie {
        answer.headers_mut().insert(header::SET_COOKIE, session_cookie(&token, None));
    }
    Ok(answer)
}

/// Ends the caller's session and clears the cookie.
#[utoipa::path(post, path = "/api/logout", tag = "session",
    responses((status = 204, description = "Logged out"),
        (status = 401, description = "Not logged in", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
pub async fn logout(Extract(http): Extract<Http>, caller: Caller) -> ApiResult<Response> {
    http.web_sessions.closed(&caller.session.account, &caller.token);
    if let Some(session) = http.state.sessions.close(&caller.token) {
        let state = Arc::clone(&http.state);
        blocking(move || {
            state.end_record(&session, "ended: logged out");
            Ok(())
        })
        .await?;
    }
    let mut answer = StatusCode::NO_CONTENT.into_response();
    answer.headers_mut().insert(header::SET_COOKIE, session_cookie("", Some(0)));
    Ok(answer)
}

/// The caller's account and session.
#[utoipa::path(get, path = "/api/whoami", tag = "session",
    responses((status = 200, description = "OK", body = Whoami),
        (status = 401, description = "Not logged in", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
pub async fn whoami(caller: Caller) -> Json<Whoami> {
    let s = &caller.session;
    Json(Whoami { account: s.account.clone(), admin: s.node.is_none(), session: s.id, token: None })
}
