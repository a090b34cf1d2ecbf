//! The pipeline's bounded queue: a thread with nothing to do sleeps at once.
//!
//! crossbeam's channels spin, then `sched_yield` several times, before they sleep: cheap when
//! a core is idle, but on a restore of many small files, where the reader, the workers and
//! the writer hand each other a piece per file, the yields were most of the system calls
//! (68,000 `sched_yield` for 92,000 files, issue 24) and took turns from threads with work on
//! a machine with fewer cores than threads. Here a waiting thread parks on a condition
//! variable, and a thread that hands over an item wakes a waiter only if there is one, so a
//! queue that never runs empty or full costs no system call at all.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Receivers wait here for an item, or for the last sender to go.
    readable: Condvar,
    /// Senders wait here for room, or for the last receiver to go.
    writable: Condvar,
    capacity: usize,
}

struct State<T> {
    items: VecDeque<T>,
    senders: usize,
    receivers: usize,
    /// Threads asleep on `readable` and on `writable`: nobody is woken when nobody sleeps.
    waiting_readers: usize,
    waiting_writers: usize,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Every change to the state completes before the lock is released, and nothing in
        // it can panic midway: a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A bounded queue of at most `capacity` items (at least one) between any number of senders
/// and receivers. As with crossbeam's, a send fails once every receiver is gone and a
/// receive ends once every sender is gone and the queue is empty.
pub fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::with_capacity(capacity.max(1)),
            senders: 1,
            receivers: 1,
            waiting_readers: 0,
            waiting_writers: 0,
        }),
        readable: Condvar::new(),
        writable: Condvar::new(),
        capacity: capacity.max(1),
    });
    (Sender(Arc::clone(&shared)), Receiver(shared))
}

/// The sending side of [`bounded`].
pub struct Sender<T>(Arc<Shared<T>>);

/// The receiving side of [`bounded`].
pub struct Receiver<T>(Arc<Shared<T>>);

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("queue::Sender")
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("queue::Receiver")
    }
}

impl<T> Sender<T> {
    /// Queues `item`, sleeping while the queue is full; gives it back if no receiver is left.
    pub fn send(&self, item: T) -> Result<(), T> {
        let shared = &*self.0;
        let mut state = shared.lock();
        while state.items.len() >= shared.capacity {
            if state.receivers == 0 {
                return Err(item);
            }
            state.waiting_writers += 1;
            state = shared.writable.wait(state).unwrap_or_else(PoisonError::into_inner);
            state.waiting_writers -= 1;
        }
        if state.receivers == 0 {
            return Err(item);
        }
        state.items.push_back(item);
        let wake = state.waiting_readers > 0;
        drop(state);
        if wake {
            shared.readable.notify_one();
        }
        Ok(())
    }
}

impl<T> Receiver<T> {
    /// The next item, sleeping while the queue is empty; `None` once it is empty and every
    /// sender is gone.
    pub fn recv(&self) -> Option<T> {
        let shared = &*self.0;
        let mut state = shared.lock();
        loop {
            if let Some(item) = state.items.pop_front() {
                let wake = state.waiting_writers > 0;
                drop(state);
                if wake {
                    shared.writable.notify_one();
                }
                return Some(item);
            }
            if state.senders == 0 {
                return None;
            }
            state.waiting_readers += 1;
            state = shared.readable.wait(state).unwrap_or_else(PoisonError::into_inner);
            state.waiting_readers -= 1;
        }
    }

    /// The items until every sender is gone.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(|| self.recv())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.0.lock().senders += 1;
        Sender(Arc::clone(&self.0))
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        self.0.lock().receivers += 1;
        Receiver(Arc::clone(&self.0))
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.senders -= 1;
        let last = state.senders == 0;
        drop(state);
        if last {
            // Every sleeping receiver must see the end, not only one.
            self.0.readable.notify_all();
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.receivers -= 1;
        let last = state.receivers == 0;
        drop(state);
        if last {
            self.0.writable.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn items_arrive_once_and_in_order_for_one_receiver() {
        let (tx, rx) = bounded(3);
        let producer = std::thread::spawn(move || {
            for i in 0..10_000u32 {
                assert!(tx.send(i).is_ok());
            }
        });
        let got: Vec<u32> = rx.iter().collect();
        producer.join().unwrap();
        assert_eq!(got, (0..10_000).collect::<Vec<_>>());
    }

    #[test]
    fn many_senders_and_receivers_lose_and_repeat_nothing() {
        let (tx, rx) = bounded(2);
        let mut handles = Vec::new();
        for s in 0..4u64 {
            let tx = tx.clone();
            handles.push(std::thread::spawn(move || {
                for i in 0..5_000u64 {
                    assert!(tx.send(s * 1_000_000 + i).is_ok());
                }
                Vec::new()
            }));
        }
        drop(tx);
        for _ in 0..3 {
            let rx = rx.clone();
            handles.push(std::thread::spawn(move || rx.iter().collect::<Vec<u64>>()));
        }
        drop(rx);
        let mut got: Vec<u64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        got.sort_unstable();
        let mut want: Vec<u64> =
            (0..4u64).flat_map(|s| (0..5_000u64).map(move |i| s * 1_000_000 + i)).collect();
        want.sort_unstable();
        assert_eq!(got, want);
    }

    #[test]
    fn the_capacity_bounds_what_is_queued() {
        let (tx, rx) = bounded(2);
        assert!(tx.send(1).is_ok());
        assert!(tx.send(2).is_ok());
        let blocked = std::thread::spawn(move || tx.send(3));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!blocked.is_finished(), "a third item went into a queue of two");
        assert_eq!(rx.recv(), Some(1));
        assert!(blocked.join().unwrap().is_ok());
        assert_eq!(rx.recv(), Some(2));
        assert_eq!(rx.recv(), Some(3));
        assert_eq!(rx.recv(), None, "the sender is gone: the queue ends");
    }

    #[test]
    fn a_sleeping_sender_is_released_when_the_receivers_go() {
        let (tx, rx) = bounded(1);
        assert!(tx.send(1).is_ok());
        let blocked = std::thread::spawn(move || tx.send(2));
        std::thread::sleep(Duration::from_millis(50));
        drop(rx);
        assert_eq!(blocked.join().unwrap(), Err(2));
    }

    #[test]
    fn every_sleeping_receiver_sees_the_end() {
        let (tx, rx) = bounded::<u8>(1);
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || rx.recv())
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        drop(tx);
        for w in waiting {
            assert_eq!(w.join().unwrap(), None);
        }
    }
}
