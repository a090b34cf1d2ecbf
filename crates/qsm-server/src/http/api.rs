//! The JSON API's routes: each an operation of the server core, run as the logged-in
//! administrator (module `auth`), answering with the reports `qsm admin --json` prints
//! ([`qsm_proto::reports`]), so the API, the console and the command line name every field
//! alike. Bad input (malformed JSON, a bad path or query) is a 400 naming what was wrong.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State as Extract};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use qsm_proto::reports::{
    ActlogRow, AuditReport, BackupDbReport, BackupRunRow, ClassRow, DamagedRow, DomainRow,
    EventRow, ExpireReport, FilespaceRow, NodeRow, ProcessRow, ReclaimReport, RunRow, ScheduleRow,
    SessionRow, StgpoolRow,
};
use serde::{Deserialize, Serialize};
use utoipa::OpenApi;

use super::auth::{self, AdminCaller};
use super::overview::{self, Overview};
use super::{ApiError, ApiResult, ErrorBody, Http, blocking, json_body, path, query};
use crate::admin_core::{AdminSession, MAX_ACTLOG_ENTRIES, MAX_EXPIRE_WORKERS};

/// The API's routes, under `/api`.
pub fn routes() -> axum::Router<Http> {
    axum::Router::new()
        .route("/openapi.json", get(openapi))
        .route("/login", post(auth::login))
        .route("/logout", post(auth::logout))
        .route("/whoami", get(auth::whoami))
        .route("/overview", get(overview))
        .route("/nodes", get(nodes))
        .route("/nodes/{name}/filespaces", get(filespaces))
        .route("/nodes/{name}/backups", get(backups))
        .route("/nodes/{name}/lock", post(lock_node))
        .route("/nodes/{name}/unlock", post(unlock_node))
        .route("/sessions", get(sessions))
        .route("/sessions/{id}/cancel", post(cancel_session))
        .route("/processes", get(processes))
        .route("/processes/{id}/cancel", post(cancel_process))
        .route("/events", get(events))
        .route("/actlog", get(actlog))
        .route("/policy", get(policy))
        .route("/schedules", get(schedules))
        .route("/stgpools", get(stgpools))
        .route("/expire", post(expire))
        .route("/reclaim", post(reclaim))
        .route("/audit", post(audit))
        .route("/backup-db", post(backup_db))
        .nest("/my", super::files::routes())
}

impl AdminCaller {
    /// Runs `op` of the server core as this administrator, off the async threads.
    async fn run<T: Send + 'static>(
        self,
        http: &Http,
        op: impl FnOnce(qsm_proto::Admin<'_>) -> Result<T, qsm_types::ServerError> + Send + 'static,
    ) -> ApiResult<T> {
        let state = Arc::clone(&http.state);
        blocking(move || {
            let core = AdminSession::new(&state, self.0);
            op(qsm_proto::Admin(&core))
        })
        .await
    }
}

fn done() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// The OpenAPI description of this API.
#[utoipa::path(get, path = "/api/openapi.json", tag = "session",
    responses((status = 200, description = "OpenAPI 3.1", content_type = "application/json")))]
async fn openapi() -> Response {
    match ApiDoc::openapi().to_pretty_json() {
        Ok(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// At a glance: which nodes are protected, at risk or failed, pool and catalog use, data
/// stored and saved.
#[utoipa::path(get, path = "/api/overview", tag = "overview",
    responses((status = 200, description = "OK", body = Overview), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn overview(Extract(http): Extract<Http>, a: AdminCaller) -> ApiResult<Json<Overview>> {
    let (kept, state) = (Arc::clone(&http.overview), Arc::clone(&http.state));
    a.run(&http, move |admin| overview::read(&kept, &state, admin)).await.map(Json)
}

#[utoipa::path(get, path = "/api/nodes", tag = "nodes",
    responses((status = 200, description = "OK", body = [NodeRow]), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn nodes(Extract(http): Extract<Http>, a: AdminCaller) -> ApiResult<Json<Vec<NodeRow>>> {
    a.run(&http, |admin| admin.nodes()).await.map(Json)
}

/// A node's filespaces, with their last backup and last completed one.
#[utoipa::path(get, path = "/api/nodes/{name}/filespaces", tag = "nodes",
    params(("name" = String, Path, description = "The node")),
    responses((status = 200, description = "OK", body = [FilespaceRow]), (status = 404, description = "No such thing", body = ErrorBody),
        (status = 401, description = "Not logged in", body = ErrorBody), (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn filespaces(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    name: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Vec<FilespaceRow>>> {
    let name = path(name)?;
    a.run(&http, move |admin| admin.filespaces(Some(&name))).await.map(Json)
}

/// Which backups to list.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct BackupsQuery {
    /// One filespace (default: all of the node's).
    filespace: Option<String>,
    /// Runs that ended at or after this time (seconds since the epoch; default 0).
    since: Option<i64>,
}

/// A node's backup history (at most the last 400 runs of each filespace), oldest first.
#[utoipa::path(get, path = "/api/nodes/{name}/backups", tag = "nodes",
    params(("name" = String, Path, description = "The node"), BackupsQuery),
    responses((status = 200, description = "OK", body = [BackupRunRow]), (status = 404, description = "No such thing", body = ErrorBody),
        (status = 400, description = "Malformed request", body = ErrorBody), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn backups(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<BackupsQuery>, QueryRejection>,
) -> ApiResult<Json<Vec<BackupRunRow>>> {
    let (name, q) = (path(name)?, query(q)?);
    a.run(&http, move |admin| {
        admin.backup_runs(&name, q.filespace.as_deref(), q.since.unwrap_or(0))
    })
    .await
    .map(Json)
}

/// Locks a node: its sessions are cancelled and it cannot log in (policy privilege).
#[utoipa::path(post, path = "/api/nodes/{name}/lock", tag = "nodes",
    params(("name" = String, Path, description = "The node")),
    responses((status = 204, description = "Locked"), (status = 404, description = "No such thing", body = ErrorBody),
        (status = 401, description = "Not logged in", body = ErrorBody), (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn lock_node(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    name: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let name = path(name)?;
    a.run(&http, move |admin| admin.set_node_locked(&name, true)).await.map(|()| done())
}

/// Unlocks a node (policy privilege).
#[utoipa::path(post, path = "/api/nodes/{name}/unlock", tag = "nodes",
    params(("name" = String, Path, description = "The node")),
    responses((status = 204, description = "Unlocked"), (status = 404, description = "No such thing", body = ErrorBody),
        (status = 401, description = "Not logged in", body = ErrorBody), (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn unlock_node(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    name: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let name = path(name)?;
    a.run(&http, move |admin| admin.set_node_locked(&name, false)).await.map(|()| done())
}

/// Sessions open on every server sharing the catalog.
#[utoipa::path(get, path = "/api/sessions", tag = "activity",
    responses((status = 200, description = "OK", body = [SessionRow]), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn sessions(
    Extract(http): Extract<Http>,
    a: AdminCaller,
) -> ApiResult<Json<Vec<SessionRow>>> {
    a.run(&http, |admin| admin.sessions()).await.map(Json)
}

/// Cancels a session (operator privilege).
#[utoipa::path(post, path = "/api/sessions/{id}/cancel", tag = "activity",
    params(("id" = u64, Path, description = "The session")),
    responses((status = 204, description = "Cancelled"), (status = 404, description = "No such thing", body = ErrorBody),
        (status = 400, description = "Malformed request", body = ErrorBody), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn cancel_session(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    id: Result<Path<u64>, PathRejection>,
) -> ApiResult<Response> {
    let id = path(id)?;
    a.run(&http, move |admin| admin.cancel_session(id)).await.map(|()| done())
}

/// Server processes running now (expiration, reclamation, audit, catalog backup...).
#[utoipa::path(get, path = "/api/processes", tag = "activity",
    responses((status = 200, description = "OK", body = [ProcessRow]), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn processes(
    Extract(http): Extract<Http>,
    a: AdminCaller,
) -> ApiResult<Json<Vec<ProcessRow>>> {
    a.run(&http, |admin| admin.processes()).await.map(Json)
}

/// Cancels a process at its next transaction boundary (operator privilege).
#[utoipa::path(post, path = "/api/processes/{id}/cancel", tag = "activity",
    params(("id" = u64, Path, description = "The process")),
    responses((status = 204, description = "Cancelled"), (status = 404, description = "No such thing", body = ErrorBody),
        (status = 400, description = "Malformed request", body = ErrorBody), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn cancel_process(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    id: Result<Path<u64>, PathRejection>,
) -> ApiResult<Response> {
    let id = path(id)?;
    a.run(&http, move |admin| admin.cancel_process(id)).await.map(|()| done())
}

/// Which events to list.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    /// One node's (default: every node's).
    node: Option<String>,
    /// Scheduled at or after this time (seconds since the epoch; default: the last day).
    since: Option<i64>,
}

/// Schedule events: each scheduled run and how it went.
#[utoipa::path(get, path = "/api/events", tag = "activity", params(EventsQuery),
    responses((status = 200, description = "OK", body = [EventRow]), (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
        (status = 401, description = "Not logged in", body = ErrorBody), (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn events(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> ApiResult<Json<Vec<EventRow>>> {
    let q = query(q)?;
    a.run(&http, move |admin| admin.events(q.node.as_deref(), q.since)).await.map(Json)
}

/// Which activity-log entries to list.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ActlogQuery {
    /// From this time (seconds since the epoch; default: the last 24 hours).
    since: Option<i64>,
    /// Only entries containing this text (case-insensitive).
    search: Option<String>,
    /// At most this many entries, the newest (default 1000, at most 100000).
    #[param(minimum = 1, maximum = 100000)]
    limit: Option<u32>,
}

/// A page of the activity log.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ActlogPage {
    entries: Vec<ActlogRow>,
    /// More entries matched than the limit let through.
    truncated: bool,
}

/// The activity log: logins, session ends, administrative actions, processes, warnings.
#[utoipa::path(get, path = "/api/actlog", tag = "activity", params(ActlogQuery),
    responses((status = 200, description = "OK", body = ActlogPage), (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Not logged in", body = ErrorBody), (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn actlog(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    q: Result<Query<ActlogQuery>, QueryRejection>,
) -> ApiResult<Json<ActlogPage>> {
    let q = query(q)?;
    let limit = q.limit.unwrap_or(1000);
    if !(1..=MAX_ACTLOG_ENTRIES).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit {limit}: give 1 to {MAX_ACTLOG_ENTRIES} entries"
        )));
    }
    let since = q.since.unwrap_or_else(|| qsm_types::now() - 86_400);
    let search = q.search.filter(|s| !s.is_empty());
    let log = a.run(&http, move |admin| admin.actlog(since, search, limit)).await?;
    Ok(Json(ActlogPage { entries: log.entries, truncated: log.truncated }))
}

/// Policy domains, their management classes and copy groups.
#[utoipa::path(get, path = "/api/policy", tag = "policy",
    responses((status = 200, description = "OK", body = [DomainRow]), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn policy(Extract(http): Extract<Http>, a: AdminCaller) -> ApiResult<Json<Vec<DomainRow>>> {
    a.run(&http, |admin| admin.policy()).await.map(Json)
}

/// Schedules, with their next window.
#[utoipa::path(get, path = "/api/schedules", tag = "policy",
    responses((status = 200, description = "OK", body = [ScheduleRow]), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn schedules(
    Extract(http): Extract<Http>,
    a: AdminCaller,
) -> ApiResult<Json<Vec<ScheduleRow>>> {
    a.run(&http, |admin| admin.schedules()).await.map(Json)
}

/// Storage pools: containers, bytes, the share reclaimable, damaged chunks.
#[utoipa::path(get, path = "/api/stgpools", tag = "storage",
    responses((status = 200, description = "OK", body = [StgpoolRow]), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn stgpools(
    Extract(http): Extract<Http>,
    a: AdminCaller,
) -> ApiResult<Json<Vec<StgpoolRow>>> {
    a.run(&http, |admin| admin.stgpools()).await.map(Json)
}

/// The longest expiration the API starts: a year.
const MAX_EXPIRE_MINUTES: u32 = 525_600;

/// `expire inventory`'s options.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ExpireRequest {
    /// Worker threads (default 4).
    #[schema(minimum = 1, maximum = 64)]
    resource: Option<u32>,
    /// Only these nodes (default: all).
    #[serde(default)]
    nodes: Vec<String>,
    /// Stop after this many minutes (at most a year).
    #[schema(minimum = 1, maximum = 525600)]
    duration_minutes: Option<u32>,
}

/// Expires inventory past its policy (a process; answers when it ends).
#[utoipa::path(post, path = "/api/expire", tag = "storage", request_body(content = Option<ExpireRequest>, description = "Options (all optional; no body takes the defaults)"),
    responses((status = 200, description = "OK", body = ExpireReport), (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Not logged in", body = ErrorBody), (status = 403, description = "Not allowed for this account", body = ErrorBody),
        (status = 409, description = "Already running", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn expire(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<ExpireReport>> {
    let r: ExpireRequest = json_body(&headers, b)?;
    let resource = r.resource.unwrap_or(4);
    if !(1..=MAX_EXPIRE_WORKERS).contains(&resource) {
        return Err(ApiError::bad_request(format!(
            "resource {resource}: give 1 to {MAX_EXPIRE_WORKERS} workers"
        )));
    }
    if let Some(m) = r.duration_minutes.filter(|m| !(1..=MAX_EXPIRE_MINUTES).contains(m)) {
        return Err(ApiError::bad_request(format!(
            "duration_minutes {m}: give 1 to {MAX_EXPIRE_MINUTES} minutes (a year)"
        )));
    }
    a.run(&http, move |admin| admin.expire_inventory(resource, r.nodes, r.duration_minutes))
        .await
        .map(Json)
}

/// `reclaim stgpool`'s options.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ReclaimRequest {
    /// Rewrite containers at least this percent reclaimable (default 60).
    #[schema(minimum = 1, maximum = 100)]
    threshold: Option<u32>,
}

/// Reclaims the pool's space (a process; answers when it ends).
#[utoipa::path(post, path = "/api/reclaim", tag = "storage", request_body(content = Option<ReclaimRequest>, description = "Options (all optional; no body takes the defaults)"),
    responses((status = 200, description = "OK", body = ReclaimReport), (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Not logged in", body = ErrorBody), (status = 403, description = "Not allowed for this account", body = ErrorBody),
        (status = 409, description = "Already running", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn reclaim(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<ReclaimReport>> {
    let threshold = json_body::<ReclaimRequest>(&headers, b)?.threshold.unwrap_or(60);
    if !(1..=100).contains(&threshold) {
        return Err(ApiError::bad_request(format!(
            "threshold {threshold}: give 1 to 100 percent reclaimable"
        )));
    }
    a.run(&http, move |admin| admin.reclaim_stgpool(threshold)).await.map(Json)
}

/// `audit stgpool`'s options.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct AuditRequest {
    /// Mark damaged chunks and the versions using them (the next backup sends them again).
    #[serde(default)]
    mark_damaged: bool,
    /// Release containers the catalog does not know to reclamation.
    #[serde(default)]
    release_unknown: bool,
}

/// Reads every frame of the pool and checks it (a process; answers when it ends).
#[utoipa::path(post, path = "/api/audit", tag = "storage", request_body(content = Option<AuditRequest>, description = "Options (all optional; no body takes the defaults)"),
    responses((status = 200, description = "OK", body = AuditReport), (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Not logged in", body = ErrorBody), (status = 403, description = "Not allowed for this account", body = ErrorBody),
        (status = 409, description = "Already running", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn audit(
    Extract(http): Extract<Http>,
    a: AdminCaller,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<AuditReport>> {
    let r: AuditRequest = json_body(&headers, b)?;
    a.run(&http, move |admin| admin.audit_stgpool(r.mark_damaged, r.release_unknown, Vec::new()))
        .await
        .map(Json)
}

/// Backs the catalog up to the server's default place (a process; answers when it ends).
#[utoipa::path(post, path = "/api/backup-db", tag = "storage",
    responses((status = 200, description = "OK", body = BackupDbReport), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody), (status = 409, description = "Refused in the present state", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
async fn backup_db(
    Extract(http): Extract<Http>,
    a: AdminCaller,
) -> ApiResult<Json<BackupDbReport>> {
    a.run(&http, |admin| admin.backup_db(None)).await.map(Json)
}

/// The API's description.
#[derive(OpenApi)]
#[openapi(
    info(title = "QSM server API", description = "Administer a QSM server: the operations of \
        `qsm admin`, as JSON over HTTPS. Log in with POST /api/login; send the session cookie \
        (and the X-QSM-CSRF header on changes) or `Authorization: Bearer TOKEN`."),
    paths(openapi, auth::login, auth::logout, auth::whoami, overview, nodes, filespaces,
        backups, lock_node, unlock_node, sessions, cancel_session, processes, cancel_process,
        events, actlog, policy, schedules, stgpools, expire, reclaim, audit, backup_db,
        super::files::filespaces, super::files::files, super::files::download,
        super::files::tar),
    components(schemas(ErrorBody, RunRow, ClassRow, DamagedRow)),
    modifiers(&Security)
)]
#[derive(Debug)]
pub struct ApiDoc;

#[derive(Debug)]
struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::SecurityScheme;
        use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "cookie",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                auth::COOKIE,
                "Set by POST /api/login; changes also need the X-QSM-CSRF header.",
            ))),
        );
    }
}
