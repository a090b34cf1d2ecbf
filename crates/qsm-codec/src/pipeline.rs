//! The bounded, ordered pipeline under both directions of the engine.
//!
//! One reader thread fills slots from the input, `threads` workers transform them, and the
//! caller's thread writes them in sequence order. Slots are recycled: there are exactly
//! [`slots_for`] of them, so memory is bounded by `slots × (input + output buffer)` whatever
//! the input size (with 1 MiB quanta and 2 threads: 12 slots, about 24 MiB). Because every
//! slot is transformed on its own and written in order, the output does not depend on the
//! thread count. Errors are reported in stream order: on the first failure the reader stops,
//! the workers finish what is queued, and the writer returns the failure with the lowest
//! sequence number, so damage to quantum 3 is reported as quantum 3 whatever the timing.
//! A failure of the writer itself, or of a worker's setup, stops every stage at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::queue::{self, bounded};

use crate::error::Error;
use crate::frame::FrameHeader;

/// The engine's slot: one quantum in flight and its buffers, reused from quantum to quantum.
/// Other users of [`run`] bring their own slot type.
#[derive(Debug, Default)]
pub struct Slot {
    /// Input bytes (raw data, or a whole frame); `input[..input_len]` is valid.
    pub input: Vec<u8>,
    pub input_len: usize,
    /// Output bytes (a frame, or raw data); `output[..output_len]` is valid.
    pub output: Vec<u8>,
    pub output_len: usize,
    /// Where the quantum starts in the input.
    pub offset: u64,
    /// The frame header (read, or produced).
    pub header: Option<FrameHeader>,
}

/// Slots for `threads` workers: two per worker keep each busy while the writer drains (zstdmt
/// keeps `2 × workers + 3`), and a reserve of 8 absorbs a worker preempted while it holds the
/// oldest quantum: the writer must wait for it, and without the reserve the reader soon has
/// no free slot and the other workers idle. On 2 cores, 4 extra slots raised parallel LZ4
/// decoding from 90% to 93% of two independent processes and DEFLATE decoding from 96% to
/// 102% (5 interleaved runs each, docs/PERFORMANCE.md 1.3). A constant, not per worker, so
/// 64 workers still need only 136 slots.
pub fn slots_for(threads: usize) -> usize {
    2 * threads.max(1) + 8
}

/// [`slots_for`] `threads`, but no more than `budget` bytes of slots of up to `slot_bytes`
/// each (at least 4 slots): a user whose slots hold large buffers keeps its memory bounded
/// whatever the thread count (a restore on 64 cores would otherwise hold 136 slots of 2 MiB
/// quanta and their decoded copies).
pub fn slots_within(threads: usize, slot_bytes: usize, budget: usize) -> usize {
    slots_for(threads).min((budget / slot_bytes.max(1)).max(4))
}

enum Msg<T> {
    Done(u64, T),
    /// Slot `seq` failed (in the reader or a worker).
    Failed(u64, Error),
    /// A stage could not start: nothing can be processed.
    Fatal(Error),
    End(u64),
}

/// Runs the pipeline: `source` fills a slot (returns `false` at the end of input) on the
/// reader thread, `work` transforms it on a worker with per-thread state from `make_worker`,
/// and `sink` consumes slots in order on the caller's thread. Returns the number of slots
/// processed. The engine runs it on [`Slot`]s; the backup client runs it across files with
/// slots of its own.
pub fn run<T, Src, Mk, Ctx, Wk, Snk>(
    threads: usize,
    source: Src,
    make_worker: Mk,
    work: Wk,
    sink: Snk,
) -> Result<u64, Error>
where
    T: Default + Send,
    Src: FnMut(u64, &mut T) -> Result<bool, Error> + Send,
    Mk: Fn() -> Result<Ctx, Error> + Sync,
    Wk: Fn(&mut Ctx, u64, &mut T) -> Result<(), Error> + Sync,
    Snk: FnMut(u64, &T) -> Result<(), Error>,
{
    run_with_slots(threads, slots_for(threads), source, make_worker, work, sink)
}

/// [`run`] with `slots` slots (see [`slots_within`]) instead of [`slots_for`] `threads`; no
/// more workers than slots, since each works on one.
pub fn run_with_slots<T, Src, Mk, Ctx, Wk, Snk>(
    threads: usize,
    slots: usize,
    mut source: Src,
    make_worker: Mk,
    work: Wk,
    mut sink: Snk,
) -> Result<u64, Error>
where
    T: Default + Send,
    Src: FnMut(u64, &mut T) -> Result<bool, Error> + Send,
    Mk: Fn() -> Result<Ctx, Error> + Sync,
    Wk: Fn(&mut Ctx, u64, &mut T) -> Result<(), Error> + Sync,
    Snk: FnMut(u64, &T) -> Result<(), Error>,
{
    let slots = slots.max(1);
    let threads = threads.clamp(1, slots);
    let (free_tx, free_rx) = bounded::<T>(slots);
    for _ in 0..slots {
        // Cannot fail: the channel has room for every slot and its receiver is alive.
        let _ = free_tx.send(T::default());
    }
    let (work_tx, work_rx) = bounded::<(u64, T)>(slots);
    let (done_tx, done_rx) = bounded::<Msg<T>>(slots + threads + 1);
    // `stop_reading`: set by the writer on the first failure. `abort`: set when the writer
    // gives up; workers then drop what is queued.
    let (stop_reading, abort) = (AtomicBool::new(false), AtomicBool::new(false));
    let (stop_reading, abort, make_worker, work) = (&stop_reading, &abort, &make_worker, &work);

    std::thread::scope(|scope| {
        let done = done_tx.clone();
        scope.spawn(move || {
            let mut seq = 0;
            while !stop_reading.load(Ordering::Relaxed) {
                let Some(mut slot) = free_rx.recv() else { return };
                let msg = match source(seq, &mut slot) {
                    Ok(true) => {
                        if work_tx.send((seq, slot)).is_err() {
                            return;
                        }
                        seq += 1;
                        continue;
                    }
                    Ok(false) => Msg::End(seq),
                    Err(e) => Msg::Failed(seq, e),
                };
                let _ = done.send(msg);
                return;
            }
        });
        for _ in 0..threads {
            let (work_rx, done) = (work_rx.clone(), done_tx.clone());
            scope.spawn(move || {
                let mut ctx = match make_worker() {
                    Ok(ctx) => ctx,
                    Err(e) => {
                        let _ = done.send(Msg::Fatal(e));
                        return;
                    }
                };
                for (seq, mut slot) in work_rx.iter() {
                    if abort.load(Ordering::Relaxed) {
                        return;
                    }
                    let msg = match work(&mut ctx, seq, &mut slot) {
                        Ok(()) => Msg::Done(seq, slot),
                        Err(e) => Msg::Failed(seq, e),
                    };
                    if done.send(msg).is_err() {
                        return;
                    }
                }
            });
        }
        drop((done_tx, work_rx));

        let result = drain(&done_rx, &free_tx, stop_reading, &mut sink);
        if result.is_err() {
            stop_reading.store(true, Ordering::Relaxed);
            abort.store(true, Ordering::Relaxed);
        }
        // Unblock every stage: workers fail to send, the reader fails to get a slot.
        drop((done_rx, free_tx));
        result
    })
}

fn drain<T, Snk>(
    done: &queue::Receiver<Msg<T>>,
    free: &queue::Sender<T>,
    stop_reading: &AtomicBool,
    sink: &mut Snk,
) -> Result<u64, Error>
where
    Snk: FnMut(u64, &T) -> Result<(), Error>,
{
    // Every slot below a failed one was handed to a worker before the failure, and workers
    // finish their queue unless aborted, so waiting for them cannot hang.
    let mut pending: BTreeMap<u64, Result<T, Error>> = BTreeMap::new();
    let (mut next, mut end) = (0u64, None);
    while end != Some(next) {
        match done.recv() {
            Some(Msg::Done(seq, slot)) => {
                pending.insert(seq, Ok(slot));
            }
            Some(Msg::Failed(seq, e)) => {
                stop_reading.store(true, Ordering::Relaxed);
                pending.insert(seq, Err(e));
            }
            Some(Msg::Fatal(e)) => return Err(e),
            Some(Msg::End(count)) => end = Some(count),
            None => {
                return Err(Error::Invalid("internal error: a pipeline stage stopped".into()));
            }
        }
        while let Some(result) = pending.remove(&next) {
            let slot = result?;
            sink(next, &slot)?;
            next += 1;
            let _ = free.send(slot);
        }
    }
    Ok(next)
}
