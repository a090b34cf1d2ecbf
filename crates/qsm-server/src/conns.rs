//! Connections that say when they close. A session is a token, not a connection; but a client
//! killed with -9, or whose machine went away, never logs out, and its session would stay
//! "running" until the idle timeout, counting against `max_sessions`. So every connection gets
//! a number, requests carry it (as their [`Conn`]), and it is reported when the connection
//! closes (the kernel closes a killed process's sockets at once; HTTP/2 keep-alive pings find
//! a peer that vanished). A session whose every connection has closed is orphaned, and the
//! reaper ends it unless a request over a new connection reclaims it within a grace period (a
//! client whose connection dropped reconnects and goes on with its token). Numbers, not peer
//! addresses: a client's channel may reconnect from another port mid-session, and a port may
//! be reused by another client.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc::UnboundedSender;
use tonic::Request;
use tonic::transport::server::{Connected, TlsConnectInfo};

/// The connection a request came over.
#[derive(Debug, Clone)]
pub struct Conn {
    /// Unique for the server's life.
    pub id: u64,
    /// The peer as the session list and the activity log name it: `ADDR:PORT`, or the local
    /// socket's process and user.
    pub peer: String,
    /// A local socket's peer user.
    pub uid: Option<u32>,
    flags: Arc<Flags>,
}

/// What a connection and the sessions using it tell each other, without a lock: a session
/// marks the connection as carrying it and then looks whether it closed; the connection marks
/// itself closed and then looks whether it carried any (both sequentially consistent), so
/// whichever comes second sees the other, and no session keeps a closed connection.
#[derive(Debug, Default)]
struct Flags {
    closed: AtomicBool,
    carried: AtomicBool,
}

impl Conn {
    /// A connection numbered `id` from `peer`.
    pub fn new(id: u64, peer: String, uid: Option<u32>) -> Conn {
        Conn { id, peer, uid, flags: Arc::default() }
    }

    /// Marks it as carrying a session; whether it has closed meanwhile.
    pub fn carry(&self) -> bool {
        self.flags.carried.store(true, Ordering::SeqCst);
        self.flags.closed.load(Ordering::SeqCst)
    }

    /// Marks it closed; whether it carried a session (whose links must then drop it).
    pub fn close(&self) -> bool {
        self.flags.closed.store(true, Ordering::SeqCst);
        self.flags.carried.load(Ordering::SeqCst)
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The connection of `request`; none for a request that came over no tracked listener.
pub fn of<T>(request: &Request<T>) -> Option<&Conn> {
    let extensions = request.extensions();
    extensions
        .get::<Conn>()
        .or_else(|| extensions.get::<TlsConnectInfo<Conn>>().map(TlsConnectInfo::get_ref))
}

/// A connection that sends its number when dropped.
#[derive(Debug)]
pub struct Tracked<S> {
    inner: S,
    conn: Conn,
    closed: UnboundedSender<u64>,
}

impl<S> Tracked<S> {
    fn new(inner: S, peer: String, uid: Option<u32>, closed: UnboundedSender<u64>) -> Tracked<S> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Tracked { inner, conn: Conn::new(id, peer, uid), closed }
    }
}

/// Tracks a TCP connection; `closed` hears its number when it closes.
pub fn tcp(
    inner: tokio::net::TcpStream,
    closed: UnboundedSender<u64>,
) -> Tracked<tokio::net::TcpStream> {
    let peer = inner.peer_addr().map_or_else(|_| "unknown".into(), |a| a.to_string());
    Tracked::new(inner, peer, None, closed)
}

/// Tracks a local socket's connection; `closed` hears its number when it closes.
pub fn unix(
    inner: tokio::net::UnixStream,
    closed: UnboundedSender<u64>,
) -> Tracked<tokio::net::UnixStream> {
    let cred = inner.peer_cred().ok();
    let peer = match (&cred, cred.as_ref().and_then(|c| c.pid())) {
        (Some(c), Some(pid)) => format!("local socket, pid {pid} uid {}", c.uid()),
        (Some(c), None) => format!("local socket, uid {}", c.uid()),
        (None, _) => "local socket".into(),
    };
    Tracked::new(inner, peer, cred.map(|c| c.uid()), closed)
}

impl<S> Drop for Tracked<S> {
    fn drop(&mut self) {
        // Only a connection that carried a session is worth a look through the sessions (a
        // failed TLS handshake, a port scan, an admin's local socket are not). The receiver
        // lives as long as the server; after shutdown nobody needs to know.
        if self.conn.close() {
            let _ = self.closed.send(self.conn.id);
        }
    }
}

impl<S> Connected for Tracked<S> {
    type ConnectInfo = Conn;

    fn connect_info(&self) -> Conn {
        self.conn.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
