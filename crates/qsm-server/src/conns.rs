//! Connections that say when they close. A session is a token, not a connection; but a client
//! killed with -9, or whose machine went away, never logs out, and its session would stay
//! "running" until the idle timeout, counting against `max_sessions`. So every TCP connection
//! reports its peer address when it closes (the kernel closes a killed process's sockets at
//! once; HTTP/2 keep-alive pings find a peer that vanished), the sessions logged in over it
//! are marked orphaned, and the reaper ends those that no request reclaimed within a grace
//! period (a client whose connection dropped reconnects and goes on with its token).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc::UnboundedSender;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A TCP connection that sends its peer address (as `Session::peer` records it) when dropped.
#[derive(Debug)]
pub struct Tracked {
    inner: tokio::net::TcpStream,
    peer: String,
    closed: UnboundedSender<String>,
}

impl Tracked {
    /// Tracks `inner`; `closed` hears its peer address when it closes.
    pub fn new(inner: tokio::net::TcpStream, closed: UnboundedSender<String>) -> Tracked {
        let peer = inner.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        Tracked { inner, peer, closed }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // The receiver lives as long as the server; after shutdown nobody needs to know.
        let _ = self.closed.send(std::mem::take(&mut self.peer));
    }
}

impl Connected for Tracked {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tracked {
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
