//! A node's own view (issue 27, part 3): a node logged in with its own credentials browses
//! its active versions and downloads a file, or a directory as a tar stream. Everything goes
//! through the node's side of the server core ([`NodeSession`]): only its own filespaces and
//! objects, the frames read as a restore reads them and checked as they are decoded. The
//! server holds no client's key, so data encrypted on the client cannot be read here: such a
//! download is refused before anything is sent, and the page says so.

use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Query, State as Extract};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use qsm_codec::frame::FrameDecoder;
use qsm_proto::reports::FilespaceRow;
use qsm_types::model::{ObjectId, ObjectType, ObjectVersion};
use qsm_types::{NodeId, ServerError};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::auth::Caller;
use super::{ApiError, ApiResult, ErrorBody, Http, blocking, query};
use crate::auth::Session;
use crate::node_core::{NodeFetch, NodeSession};
use crate::state::State;
use qsm_catalog::Severity;

/// The most entries a listing or a tar takes: past it, `qsm restore` is the tool.
const MAX_ENTRIES: usize = 100_000;
/// Bytes handed to the connection at a time.
const PIECE: usize = 256 * 1024;

/// The node's routes, under `/api/my`.
pub fn routes() -> axum::Router<Http> {
    axum::Router::new()
        .route("/filespaces", get(filespaces))
        .route("/files", get(files))
        .route("/download", get(download))
        .route("/tar", get(tar))
}

/// A logged-in node.
pub struct NodeCaller {
    session: Arc<Session>,
    node: NodeId,
}

impl FromRequestParts<Http> for NodeCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, http: &Http) -> ApiResult<NodeCaller> {
        let caller = Caller::from_request_parts(parts, http).await?;
        let Some(node) = caller.session.node else {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "these pages are a node's own files: log in with the node's name and password",
            ));
        };
        Ok(NodeCaller { session: caller.session, node })
    }
}

impl NodeCaller {
    /// Runs `op` as this node, off the async threads.
    async fn run<T: Send + 'static>(
        self,
        http: &Http,
        op: impl FnOnce(&NodeSession<'_>) -> Result<T, ServerError> + Send + 'static,
    ) -> ApiResult<T> {
        let state = Arc::clone(&http.state);
        blocking(move || op(&NodeSession::new(&state, self.node, Some(&self.session)))).await
    }
}

/// The node's filespaces, with their last backups.
#[utoipa::path(get, path = "/api/my/filespaces", tag = "node",
    responses((status = 200, description = "OK", body = [FilespaceRow]), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not a node's session", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
pub async fn filespaces(
    Extract(http): Extract<Http>,
    me: NodeCaller,
) -> ApiResult<Json<Vec<FilespaceRow>>> {
    let list = me.run(&http, |n| n.filespaces()).await?;
    Ok(Json(list.iter().map(|f| FilespaceRow::new(String::new(), f)).collect()))
}

/// A directory of one of the node's filespaces.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DirQuery {
    filespace: String,
    /// Relative to the filespace's root; empty (the default) for the root.
    #[serde(default)]
    dir: String,
}

/// One entry of a directory.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FileEntry {
    pub name: String,
    /// Relative to the filespace's root.
    pub path: String,
    /// "file", "directory", "symlink", "hard link", ...
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub size: u64,
    pub mtime: i64,
    /// The version's id, to download it.
    pub object: i64,
    /// Encrypted on the client: the server cannot read it.
    pub encrypted: bool,
    pub link_target: Option<String>,
}

/// A directory's listing.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Listing {
    pub filespace: String,
    pub dir: String,
    pub entries: Vec<FileEntry>,
    /// More entries than a listing shows.
    pub truncated: bool,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Checks a directory given by a browser: relative, clean (the server core's rule for paths).
fn check_dir(dir: &str) -> ApiResult<&str> {
    let dir = dir.trim_end_matches('/');
    crate::node_core::check_path(dir.as_bytes())
        .map_err(|e| ApiError::bad_request(format!("dir {dir:?}: {e}")))?;
    Ok(dir)
}

/// Whether `path` is `dir` itself or below it.
fn within(path: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() || path == dir || (path.starts_with(dir) && path.get(dir.len()) == Some(&b'/'))
}

/// `path` relative to `dir` (without the separating slash), if it is below `dir`; empty for
/// `dir` itself.
fn below<'p>(path: &'p [u8], dir: &[u8]) -> Option<&'p [u8]> {
    if !within(path, dir) {
        None
    } else if path.len() == dir.len() {
        Some(&[])
    } else if dir.is_empty() {
        Some(path)
    } else {
        Some(&path[dir.len() + 1..])
    }
}

/// The active versions of `filespace` below `dir` (only its direct children when
/// `children_only`, else `dir` itself too and everything below), in path order: at most
/// [`MAX_ENTRIES`], the flag saying whether more were left out.
fn selection(
    n: &NodeSession<'_>,
    filespace: &str,
    dir: &str,
    children_only: bool,
) -> Result<(Vec<ObjectVersion>, bool), ServerError> {
    let fs = n
        .open_filespace(filespace, false)?
        .ok_or_else(|| ServerError::not_found(format!("no filespace {filespace}")))?;
    let (mut found, mut more) = (Vec::new(), false);
    n.inventory(fs.id, false, &mut |v| {
        let Some(rest) = below(&v.path, dir.as_bytes()) else { return Ok(()) };
        let wanted = if children_only { !rest.is_empty() && !rest.contains(&b'/') } else { true };
        if wanted {
            if found.len() < MAX_ENTRIES {
                found.push(v.clone());
            } else {
                more = true;
            }
        }
        Ok(())
    })?;
    Ok((found, more))
}

/// What a listing calls a type.
fn kind(t: ObjectType) -> &'static str {
    match t {
        ObjectType::File => "file",
        ObjectType::Directory => "directory",
        ObjectType::Symlink => "symlink",
        ObjectType::Hardlink => "hard link",
        ObjectType::Fifo => "fifo",
        ObjectType::CharDevice => "char device",
        ObjectType::BlockDevice => "block device",
    }
}

fn entry(v: &ObjectVersion) -> FileEntry {
    let name = v.path.rsplit(|b| *b == b'/').next().unwrap_or(&v.path);
    FileEntry {
        name: text(name),
        path: text(&v.path),
        kind: kind(v.object_type),
        size: v.attrs.size,
        mtime: v.attrs.mtime_ns.div_euclid(1_000_000_000),
        object: v.id.0,
        encrypted: v.attrs.sealed_by.is_some(),
        link_target: v.attrs.link_target.as_deref().map(text),
    }
}

/// The entries directly in a directory of one of the node's filespaces.
#[utoipa::path(get, path = "/api/my/files", tag = "node", params(DirQuery),
    responses((status = 200, description = "OK", body = Listing), (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 404, description = "No such thing", body = ErrorBody), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
pub async fn files(
    Extract(http): Extract<Http>,
    me: NodeCaller,
    q: Result<Query<DirQuery>, QueryRejection>,
) -> ApiResult<Json<Listing>> {
    let q = query(q)?;
    let dir = check_dir(&q.dir)?.to_owned();
    let filespace = q.filespace;
    me.run(&http, move |n| {
        let (mut found, truncated) = selection(n, &filespace, &dir, true)?;
        found.sort_by(|a, b| a.path.cmp(&b.path));
        let entries = found.iter().map(entry).collect();
        Ok(Json(Listing { filespace, dir, entries, truncated }))
    })
    .await
}

/// Which version to download.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ObjectQuery {
    object: i64,
}

/// Refuses what the server cannot read.
fn readable(v: &ObjectVersion) -> Result<(), ServerError> {
    if v.attrs.sealed_by.is_some() {
        return Err(ServerError::Refused(format!(
            "{} is encrypted on the client: the server cannot read it; restore it with qsm",
            text(&v.path)
        )));
    }
    if v.damaged {
        return Err(ServerError::Refused(format!(
            "{} is damaged in the storage pool (an audit found it)",
            text(&v.path)
        )));
    }
    Ok(())
}

/// What goes to the connection: pieces of the answer through a bounded channel, so a slow
/// browser slows the reading, and one that went away stops it.
struct Sender {
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    buf: Vec<u8>,
}

impl Write for Sender {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= PIECE {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::take(&mut self.buf));
        self.tx
            .blocking_send(Ok(piece))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the browser went away"))
    }
}

/// A version's content, decoded frame by frame as a restore decodes it (each frame checked),
/// with a sparse file's holes as zeros.
struct Content<'a> {
    fetch: NodeFetch<'a>,
    decoder: FrameDecoder,
    frame: Vec<u8>,
    data: Vec<u8>,
    at: usize,
    /// The data extents, in file order (the whole file when not sparse).
    extents: Vec<(u64, u64)>,
    extent: usize,
    size: u64,
    produced: u64,
    name: String,
}

impl<'a> Content<'a> {
    fn new(n: &NodeSession<'a>, v: &ObjectVersion) -> Result<Content<'a>, ServerError> {
        readable(v)?;
        let extents = v.attrs.extents.clone().unwrap_or_else(|| vec![(0, v.attrs.size)]);
        Ok(Content {
            fetch: n.fetch(vec![v.id])?,
            decoder: FrameDecoder::new(),
            frame: Vec::new(),
            data: Vec::new(),
            at: 0,
            extents,
            extent: 0,
            size: v.attrs.size,
            produced: 0,
            name: text(&v.path),
        })
    }

    fn broken(&self, why: impl std::fmt::Display) -> io::Error {
        io::Error::other(format!("{}: {why}", self.name))
    }
}

impl Read for Content<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.produced >= self.size || buf.is_empty() {
                return Ok(0);
            }
            let (start, len) = self.extents.get(self.extent).copied().unwrap_or((self.size, 0));
            if self.produced < start {
                let n = buf.len().min(usize::try_from(start - self.produced).unwrap_or(usize::MAX));
                buf[..n].fill(0);
                self.produced += n as u64;
                return Ok(n);
            }
            if self.produced >= start + len {
                self.extent += 1;
                continue;
            }
            if self.at == self.data.len() {
                let fetched = self.fetch.next(&mut self.frame).map_err(|e| self.broken(e))?;
                let Some(f) = fetched else { return Err(self.broken("its data ends early")) };
                if let Some(why) = f.error {
                    return Err(self.broken(why));
                }
                if !f.has_frame {
                    continue;
                }
                let header = self.decoder.decode(&self.frame, &mut self.data);
                let header = header.map_err(|e| self.broken(e))?;
                self.data.truncate(header.raw_len as usize);
                self.at = 0;
                if self.data.is_empty() {
                    continue;
                }
            }
            let left = usize::try_from(start + len - self.produced).unwrap_or(usize::MAX);
            let n = buf.len().min(self.data.len() - self.at).min(left);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            self.produced += n as u64;
            return Ok(n);
        }
    }
}

/// Streams what `write` writes, from a blocking task; an error after the answer started
/// cuts the stream, which the browser sees as a failed download (its length falls short).
/// The failure is also written to the activity log, naming the node and `what` was sent: the
/// browser shows only a failed download.
fn stream(
    state: Arc<State>,
    session: Arc<Session>,
    what: String,
    write: impl FnOnce(&NodeSession<'_>, &mut Sender) -> io::Result<()> + Send + 'static,
) -> Body {
    let (tx, rx) = mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        let Some(node) = session.node else { return };
        let n = NodeSession::new(&state, node, Some(&session));
        let mut out = Sender { tx: tx.clone(), buf: Vec::with_capacity(PIECE) };
        let done = write(&n, &mut out).and_then(|()| out.flush());
        if let Err(e) = done
            && e.kind() != io::ErrorKind::BrokenPipe
        {
            let why = format!("node {}: {what} cut short: {e}", session.account);
            state.log(Severity::Warning, &why, Some(node), session.record);
            let _ = tx.blocking_send(Err(e));
        }
    });
    Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

fn attachment(name: &str) -> HeaderValue {
    // RFC 6266 with RFC 5987's encoding: any byte of a name survives, none can break out.
    let mut encoded = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            encoded.push(char::from(b));
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    HeaderValue::from_str(&format!("attachment; filename*=UTF-8''{encoded}"))
        .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

/// A file's content as it was backed up (its active or inactive version `object`).
#[utoipa::path(get, path = "/api/my/download", tag = "node", params(ObjectQuery),
    responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 404, description = "No such thing", body = ErrorBody), (status = 409, description = "Encrypted on the client, \
        damaged, or not a file", body = ErrorBody), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
pub async fn download(
    Extract(http): Extract<Http>,
    me: NodeCaller,
    q: Result<Query<ObjectQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    let session = Arc::clone(&me.session);
    let v = me
        .run(&http, move |n| {
            let v = n
                .object(ObjectId(q.object))?
                .ok_or_else(|| ServerError::not_found(format!("no object {}", q.object)))?;
            if v.object_type != ObjectType::File {
                return Err(ServerError::Refused(format!(
                    "{} is a {}, not a file",
                    text(&v.path),
                    kind(v.object_type)
                )));
            }
            readable(&v)?;
            Ok(v)
        })
        .await?;
    let name = text(v.path.rsplit(|b| *b == b'/').next().unwrap_or(&v.path));
    let size = v.attrs.size;
    let what = format!("the download of {}", text(&v.path));
    let body = stream(Arc::clone(&http.state), session, what, move |n, out| {
        let mut content = Content::new(n, &v).map_err(io::Error::other)?;
        io::copy(&mut content, out).map(drop)
    });
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    h.insert(header::CONTENT_DISPOSITION, attachment(&name));
    Ok(r)
}

/// A directory and everything below it as a tar stream (POSIX ustar with GNU long names):
/// files, directories, symbolic and hard links, with modes, owners and times.
#[utoipa::path(get, path = "/api/my/tar", tag = "node", params(DirQuery),
    responses((status = 200, description = "A tar stream", content_type = "application/x-tar"),
        (status = 400, description = "Malformed request", body = ErrorBody), (status = 404, description = "No such thing", body = ErrorBody),
        (status = 409, description = "Something in it is encrypted on the client, or too many \
        entries", body = ErrorBody), (status = 401, description = "Not logged in", body = ErrorBody),
        (status = 403, description = "Not allowed for this account", body = ErrorBody)),
    security(("cookie" = []), ("bearer" = [])))]
pub async fn tar(
    Extract(http): Extract<Http>,
    me: NodeCaller,
    q: Result<Query<DirQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    let dir = check_dir(&q.dir)?.to_owned();
    let session = Arc::clone(&me.session);
    let (filespace, d) = (q.filespace.clone(), dir.clone());
    let versions = me
        .run(&http, move |n| {
            let (found, more) = selection(n, &filespace, &d, false)?;
            if more {
                return Err(ServerError::Refused(format!(
                    "more than {MAX_ENTRIES} entries: restore this directory with qsm"
                )));
            }
            if found.is_empty() && !d.is_empty() {
                return Err(ServerError::not_found(format!("no directory {d} in {filespace}")));
            }
            // Refused before the first byte, not in the middle of the stream.
            for v in found.iter().filter(|v| v.object_type == ObjectType::File) {
                readable(v)?;
            }
            Ok(found)
        })
        .await?;
    // Names in the tar start at the directory's own name (or the filespace's last part).
    let base = if dir.is_empty() { q.filespace.trim_end_matches('/') } else { &dir };
    let top = base.rsplit('/').next().filter(|s| !s.is_empty()).unwrap_or("filespace").to_owned();
    let name = format!("{top}.tar");
    let what = format!("the tar of {}/{dir}", q.filespace);
    let body = stream(Arc::clone(&http.state), session, what, move |n, out| {
        let mut t = ::tar::Builder::new(out);
        for v in &versions {
            if let Some(path) = in_tar(top.as_bytes(), dir.as_bytes(), &v.path) {
                append(&mut t, n, v, &path, top.as_bytes(), dir.as_bytes())?;
            }
        }
        t.finish()
    });
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-tar"));
    h.insert(header::CONTENT_DISPOSITION, attachment(&name));
    Ok(r)
}

/// The name in the tar of `path`, when it is below `dir`: under `top`.
fn in_tar(top: &[u8], dir: &[u8], path: &[u8]) -> Option<Vec<u8>> {
    let rest = below(path, dir)?;
    let mut name = top.to_vec();
    if !rest.is_empty() {
        name.push(b'/');
        name.extend_from_slice(rest);
    }
    Some(name)
}

/// Adds version `v` to the tar as `path`.
fn append(
    t: &mut ::tar::Builder<&mut Sender>,
    n: &NodeSession<'_>,
    v: &ObjectVersion,
    path: &[u8],
    top: &[u8],
    dir: &[u8],
) -> io::Result<()> {
    use ::tar::{EntryType, Header};
    let path = std::ffi::OsStr::from_bytes(path);
    let mut h = Header::new_gnu();
    h.set_mode(v.attrs.mode & 0o7777);
    h.set_uid(u64::from(v.attrs.uid));
    h.set_gid(u64::from(v.attrs.gid));
    h.set_mtime(u64::try_from(v.attrs.mtime_ns.div_euclid(1_000_000_000)).unwrap_or(0));
    h.set_size(0);
    match v.object_type {
        ObjectType::File => {
            h.set_entry_type(EntryType::Regular);
            h.set_size(v.attrs.size);
            let content = Content::new(n, v).map_err(io::Error::other)?;
            t.append_data(&mut h, path, content)
        }
        ObjectType::Directory => {
            h.set_entry_type(EntryType::Directory);
            t.append_data(&mut h, path, io::empty())
        }
        ObjectType::Symlink => {
            h.set_entry_type(EntryType::Symlink);
            let target = v.attrs.link_target.clone().unwrap_or_default();
            t.append_link(&mut h, path, std::ffi::OsStr::from_bytes(&target))
        }
        ObjectType::Hardlink => {
            // Its target is a path in the filespace: inside the tar when within the selection.
            let target = v.attrs.link_target.clone().unwrap_or_default();
            let Some(inside) = in_tar(top, dir, &target) else { return Ok(()) };
            h.set_entry_type(EntryType::Link);
            t.append_link(&mut h, path, std::ffi::OsStr::from_bytes(&inside))
        }
        // Pipes and devices: a tar can carry them, but a browser's user has no use for them.
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_holds_only_what_is_below_it() {
        assert!(within(b"docs/a", b"docs"));
        assert!(within(b"docs", b"docs"));
        assert!(!within(b"docsx/a", b"docs"));
        assert!(!within(b"doc", b"docs"));
        assert!(within(b"anything", b""));
    }

    #[test]
    fn a_download_name_cannot_break_its_header() {
        let v = attachment("a \"b\"\r\nSet-Cookie: x=1;.txt");
        assert_eq!(
            v.to_str().unwrap(),
            "attachment; filename*=UTF-8''a%20%22b%22%0D%0ASet-Cookie%3A%20x%3D1%3B.txt"
        );
    }

    #[test]
    fn tar_names_start_at_the_directory() {
        assert_eq!(in_tar(b"docs", b"docs", b"docs").unwrap(), b"docs");
        assert_eq!(in_tar(b"docs", b"docs", b"docs/a/b").unwrap(), b"docs/a/b");
        assert_eq!(in_tar(b"src", b"", b"a/b").unwrap(), b"src/a/b");
        assert_eq!(in_tar(b"src", b"", b"").unwrap(), b"src");
        assert!(in_tar(b"docs", b"docs", b"docsx").is_none());
        assert_eq!(below(b"a/b/c", b"a"), Some(&b"b/c"[..]));
        assert_eq!(below(b"a", b""), Some(&b"a"[..]));
    }
}
