//! Bounds on the streams (backup, inventory, fetch) that run at once. Each holds a blocking
//! thread while it runs; the catalog's calls — logins included — need blocking threads too.
//! So streams are capped in all (below tokio's 512 blocking threads) and per node, a stream
//! over the cap is refused at once rather than queued (an idle or abandoned one cannot make
//! others wait), and every wait of a running stream on its client has a time limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qsm_catalog::NodeId;
use tokio::sync::mpsc;
use tonic::Status;

/// How long a stream waits for its client to read what it sent: a client alive but reading
/// nothing (its connection is kept up by HTTP/2 pings) lets its stream go after this.
pub const SEND_LIMIT: Duration = Duration::from_secs(600);

/// The running streams.
#[derive(Debug)]
pub struct Streams {
    all: Arc<tokio::sync::Semaphore>,
    per_node: Mutex<HashMap<NodeId, usize>>,
    node_max: usize,
    max: usize,
}

/// A running stream's place, given back when dropped.
#[derive(Debug)]
pub struct Permit {
    _all: tokio::sync::OwnedSemaphorePermit,
    streams: Arc<Streams>,
    node: NodeId,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut per_node = self.streams.per_node.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = per_node.get_mut(&self.node) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_node.remove(&self.node);
            }
        }
    }
}

impl Streams {
    /// At most `max` streams, `node_max` of one node.
    pub fn new(max: usize, node_max: usize) -> Arc<Streams> {
        Arc::new(Streams {
            all: Arc::new(tokio::sync::Semaphore::new(max.max(1))),
            per_node: Mutex::new(HashMap::new()),
            node_max: node_max.max(1),
            max: max.max(1),
        })
    }

    /// A place for a stream of `node` (`account` names it in the refusal), or why not.
    pub fn start(self: &Arc<Streams>, node: NodeId, account: &str) -> Result<Permit, Status> {
        let mut per_node = self.per_node.lock().unwrap_or_else(|p| p.into_inner());
        let mine = per_node.entry(node).or_insert(0);
        if *mine >= self.node_max {
            return Err(Status::resource_exhausted(format!(
                "node {account} already runs {} streams, as many as a node may",
                self.node_max
            )));
        }
        let all = Arc::clone(&self.all).try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "the server runs {} streams, as many as it allows: try again shortly",
                self.max
            ))
        })?;
        *mine += 1;
        Ok(Permit { _all: all, streams: Arc::clone(self), node })
    }
}

/// A send from a stream's blocking thread that gives up after [`SEND_LIMIT`].
pub trait SendWithin<T> {
    /// Sends `item`, waiting at most [`SEND_LIMIT`] for room; an error if the client went away
    /// or read nothing meanwhile.
    fn send_within(&self, item: T) -> Result<(), mpsc::error::SendTimeoutError<T>>;
}

impl<T> SendWithin<T> for mpsc::Sender<T> {
    fn send_within(&self, item: T) -> Result<(), mpsc::error::SendTimeoutError<T>> {
        // Called on a blocking thread of the server's runtime, where blocking is allowed.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle.block_on(self.send_timeout(item, SEND_LIMIT)),
            Err(_) => {
                self.blocking_send(item).map_err(|e| mpsc::error::SendTimeoutError::Closed(e.0))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_bounded_in_all_and_per_node_and_given_back() {
        let s = Streams::new(3, 2);
        let a1 = s.start(NodeId(1), "a").unwrap();
        let _a2 = s.start(NodeId(1), "a").unwrap();
        let e = s.start(NodeId(1), "a").unwrap_err();
        assert!(e.message().contains("node a"), "{e:?}");
        let _b1 = s.start(NodeId(2), "b").unwrap();
        let e = s.start(NodeId(3), "c").unwrap_err();
        assert!(e.message().contains("3 streams"), "{e:?}");
        drop(a1);
        let _c = s.start(NodeId(3), "c").expect("a place was given back");
        assert!(s.start(NodeId(1), "a").is_err(), "the server is full again");
    }
}
