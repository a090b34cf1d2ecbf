//! The HTTPS listener: TLS handshakes run apart from the accept loop, each bounded in time, so
//! a client that connects and says nothing holds neither the loop nor more than its own
//! connection; connections open at once are bounded too.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections open at once, handshakes included: a browser opens a handful, a script one.
const MAX_CONNECTIONS: usize = 256;
/// Connections open at once from one address: one client cannot take every slot.
const MAX_PER_SOURCE: usize = 32;

/// Connections open per source address.
#[derive(Debug, Default)]
struct Sources(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection's place among its source's.
struct SourceSlot {
    sources: Arc<Sources>,
    ip: std::net::IpAddr,
}

impl Sources {
    fn take(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<SourceSlot> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= MAX_PER_SOURCE {
            return None;
        }
        *n += 1;
        Some(SourceSlot { sources: Arc::clone(self), ip })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.sources.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// A connection whose handshake is done; it holds its place among [`MAX_CONNECTIONS`] until
/// dropped.
pub struct Conn {
    tls: TlsStream<TcpStream>,
    _slot: OwnedSemaphorePermit,
    _source: SourceSlot,
}

/// Connections ready for HTTP, fed by the accept loop.
pub struct Listener {
    ready: mpsc::Receiver<(Conn, SocketAddr)>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Listener {
    /// Accepts on `tcp` and hands over connections once `acceptor` shook hands.
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> Listener {
        let (tx, ready) = mpsc::channel(16);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let sources = Arc::new(Sources::default());
        let accepting = tokio::spawn(async move {
            loop {
                // Waits for a free slot before accepting: past the bound, clients queue in
                // the kernel's backlog instead of costing this server anything.
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
                let (stream, addr) = match tcp.accept().await {
                    Ok(x) => x,
                    // Out of descriptors, or a connection reset before it was accepted: the
                    // next accept may work.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Past its share, an address's new connections are closed at once.
                let Some(source) = sources.take(addr.ip()) else { continue };
                let _ = stream.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let shaken = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
                    if let Ok(Ok(tls)) = shaken.await {
                        let conn = Conn { tls, _slot: slot, _source: source };
                        let _ = tx.send((conn, addr)).await;
                    }
                });
            }
        });
        Listener { ready, accepting }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl Listener {
    /// The next connection whose handshake is done, and its peer's address.
    pub async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.ready.recv().await {
            Some(x) => x,
            // The accept loop ended (the runtime is stopping): nothing more will come.
            None => std::future::pending().await,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }
}
