//! Load emulators, as STAND's: threads that keep the CPU, the TLB or the memory system busy
//! while a cell is measured, started before it and stopped after it.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

/// Where CPU-load threads run, relative to the measured thread's core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On other cores (the default).
    Other,
    /// On the measured core itself: the measured thread shares it with them.
    Same,
    /// On the measured core's hyper-thread sibling.
    Sibling,
}

/// A load scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Load {
    /// Nothing else runs: the baseline every other load is compared with.
    None,
    /// Threads doing integer arithmetic.
    Cpu { threads: usize, placement: Placement },
    /// One thread touching one byte per 4 KiB page of a working set of this many MiB, in a
    /// random page order: far beyond the TLB's reach, so nearly every touch misses it.
    Tlb { mib: usize },
    /// Threads streaming reads and writes through 64 MiB buffers each, on the CPUs (and so,
    /// by first touch, the memory) of `node` when given: with the measured data on another
    /// node that loads the interconnect (the paper's QPI load). On a single-node machine it
    /// is a memory-bandwidth load, not an interconnect one.
    Memory { threads: usize, node: Option<usize> },
}

impl Load {
    /// Parses `none`, `cpu:N[@other|@same|@sibling]`, `tlb[:MIB]`, `memory:N[@nodeK]`.
    pub fn parse(text: &str) -> Result<Load, String> {
        let bad = || {
            format!(
                "unknown load {text:?} (known: none, cpu:N[@other|@same|@sibling], tlb[:MIB], memory:N[@nodeK])"
            )
        };
        let count = |n: &str| n.parse::<usize>().ok().filter(|&n| (1..=256).contains(&n));
        match text.split_once(':') {
            None if text == "none" => Ok(Load::None),
            None if text == "tlb" => Ok(Load::Tlb { mib: 256 }),
            Some(("tlb", mib)) => match mib.parse::<usize>() {
                Ok(m) if (16..=16384).contains(&m) => Ok(Load::Tlb { mib: m }),
                _ => Err(format!("{text:?}: the working set must be 16 to 16384 MiB")),
            },
            Some(("memory", spec)) => {
                let (n, node) = match spec.split_once("@node") {
                    None => (spec, None),
                    Some((n, k)) => {
                        let k = k.parse::<usize>().map_err(|_| bad())?;
                        if !crate::numa::nodes().iter().any(|node| node.id == k) {
                            return Err(format!("{text:?}: this machine has no NUMA node {k}"));
                        }
                        (n, Some(k))
                    }
                };
                count(n).map(|threads| Load::Memory { threads, node }).ok_or_else(bad)
            }
            Some(("cpu", spec)) => {
                let (n, placement) = match spec.split_once('@') {
                    None => (spec, Placement::Other),
                    Some((n, "other")) => (n, Placement::Other),
                    Some((n, "same")) => (n, Placement::Same),
                    Some((n, "sibling")) => (n, Placement::Sibling),
                    Some(_) => return Err(bad()),
                };
                count(n).map(|threads| Load::Cpu { threads, placement }).ok_or_else(bad)
            }
            _ => Err(bad()),
        }
    }

    /// Its name in reports.
    pub fn name(&self) -> String {
        match self {
            Load::None => "none".into(),
            Load::Cpu { threads, placement } => format!(
                "cpu:{threads}@{}",
                match placement {
                    Placement::Other => "other",
                    Placement::Same => "same",
                    Placement::Sibling => "sibling",
                }
            ),
            Load::Tlb { mib } => format!("tlb:{mib}"),
            Load::Memory { threads, node: None } => format!("memory:{threads}"),
            Load::Memory { threads, node: Some(k) } => format!("memory:{threads}@node{k}"),
        }
    }
}

/// Running load threads; dropping it (or [`Running::stop`]) stops and joins them.
#[derive(Debug)]
pub struct Running {
    stop: Arc<AtomicBool>,
    work: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Running {
    /// Units of work the threads have done (a test sees that they ran).
    pub fn work(&self) -> u64 {
        self.work.load(Ordering::Relaxed)
    }

    /// Stops the threads and waits for them.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Pins the calling thread to `cpu`.
pub fn pin(cpu: usize) -> std::io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).map_err(std::io::Error::from)
}

/// The online CPUs this process may run on.
pub fn cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        Err(_) => vec![0],
    }
}

/// The hyper-thread siblings of `cpu` (itself excluded), from sysfs.
pub fn siblings(cpu: usize) -> Vec<usize> {
    let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    crate::numa::parse_cpulist(&text).into_iter().filter(|&c| c != cpu).collect()
}

/// Starts `load` around a measurement on core `measured` (the core the measuring thread is
/// pinned to, if any); `cpus` are the cores the process may use, read before pinning (a pinned
/// thread sees only its own core).
pub fn start(load: &Load, measured: Option<usize>, cpus: &[usize]) -> Result<Running, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let work = Arc::new(AtomicU64::new(0));
    let mut running =
        Running { stop: Arc::clone(&stop), work: Arc::clone(&work), threads: Vec::new() };
    let spawn = |running: &mut Running, cpu: Option<usize>, body: Box<dyn FnOnce() + Send>| {
        let body = move || {
            if let Some(cpu) = cpu {
                let _ = pin(cpu);
            }
            body();
        };
        running.threads.push(std::thread::spawn(body));
    };
    // Memory-system loads stay off the measured core when there is one: sharing it would
    // measure the scheduler's time slices (milliseconds), not the TLB or the memory bus.
    let off_core = |i: usize| -> Option<usize> {
        let m = measured?;
        let others: Vec<usize> = cpus.iter().copied().filter(|&c| c != m).collect();
        others.get(i % others.len().max(1)).copied()
    };
    match *load {
        Load::None => {}
        Load::Cpu { threads, placement } => {
            let targets: Vec<Option<usize>> = match (placement, measured) {
                (Placement::Other, Some(m)) => {
                    let others: Vec<usize> = cpus.iter().copied().filter(|&c| c != m).collect();
                    if others.is_empty() {
                        return Err(format!("cpu load on other cores: core {m} is the only one"));
                    }
                    (0..threads).map(|i| Some(others[i % others.len()])).collect()
                }
                (Placement::Other, None) => vec![None; threads],
                (Placement::Same, Some(m)) => vec![Some(m); threads],
                (Placement::Sibling, Some(m)) => {
                    let sib = siblings(m);
                    let Some(&s) = sib.first() else {
                        return Err(format!(
                            "core {m} has no hyper-thread sibling on this machine"
                        ));
                    };
                    vec![Some(s); threads]
                }
                (_, None) => {
                    return Err("cpu load @same or @sibling needs `core` set in the plan".into());
                }
            };
            for cpu in targets {
                let (stop, work) = (Arc::clone(&stop), Arc::clone(&work));
                spawn(&mut running, cpu, Box::new(move || cpu_burn(&stop, &work)));
            }
        }
        Load::Tlb { mib } => {
            let (stop, work) = (Arc::clone(&stop), Arc::clone(&work));
            spawn(&mut running, off_core(0), Box::new(move || tlb_walk(mib << 20, &stop, &work)));
        }
        Load::Memory { threads, node } => {
            let mut on_node: Vec<usize> = Vec::new();
            if let Some(k) = node {
                on_node = crate::numa::cpus_of(k, cpus);
                if on_node.is_empty() {
                    return Err(format!(
                        "memory load on node {k}: none of its CPUs is one this process may run on"
                    ));
                }
                if on_node.len() > 1 {
                    on_node.retain(|&c| Some(c) != measured);
                }
            }
            for i in 0..threads {
                let (stop, work) = (Arc::clone(&stop), Arc::clone(&work));
                // The buffers are made inside the thread, after pinning: first touch puts
                // them on the thread's node.
                let body = Box::new(move || memory_stream(64 << 20, &stop, &work));
                let cpu =
                    if on_node.is_empty() { off_core(i) } else { Some(on_node[i % on_node.len()]) };
                spawn(&mut running, cpu, body);
            }
        }
    }
    Ok(running)
}

fn cpu_burn(stop: &AtomicBool, work: &AtomicU64) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        black_box(x);
        work.fetch_add(1, Ordering::Relaxed);
    }
}

fn tlb_walk(bytes: usize, stop: &AtomicBool, work: &AtomicU64) {
    const PAGE: usize = 4096;
    let pages = bytes / PAGE;
    let mut memory = vec![0u8; bytes];
    // A random cyclic order of the pages (Sattolo's shuffle): every page once per round, no
    // pattern a prefetcher could follow.
    let mut order: Vec<u32> = (0..pages as u32).collect();
    let mut r = 0x2545_f491_4f6c_dd1du64;
    for i in (1..pages).rev() {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        order.swap(i, (r % i as u64) as usize);
    }
    while !stop.load(Ordering::Relaxed) {
        for chunk in order.chunks(4096) {
            for &p in chunk {
                memory[p as usize * PAGE] = memory[p as usize * PAGE].wrapping_add(1);
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        black_box(&memory);
        work.fetch_add(1, Ordering::Relaxed);
    }
}

fn memory_stream(bytes: usize, stop: &AtomicBool, work: &AtomicU64) {
    let mut a = vec![1u64; bytes / 16];
    let b = vec![2u64; bytes / 16];
    while !stop.load(Ordering::Relaxed) {
        for (x, y) in a.iter_mut().zip(&b) {
            *x = x.wrapping_add(*y);
        }
        black_box(&a);
        work.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_emulator_starts_works_and_stops() {
        for text in ["cpu:2", "tlb:16", "memory:1", "memory:1@node0"] {
            let load = Load::parse(text).unwrap();
            let running = start(&load, None, &cpus()).unwrap();
            let t = std::time::Instant::now();
            while running.work() == 0 {
                assert!(t.elapsed().as_secs() < 60, "{text} did no work");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            running.stop(); // returns only once every thread has ended
        }
    }

    #[test]
    fn loads_parse_and_bad_ones_are_named() {
        assert_eq!(Load::parse("cpu:1@same").unwrap().name(), "cpu:1@same");
        assert_eq!(Load::parse("tlb").unwrap(), Load::Tlb { mib: 256 });
        assert_eq!(Load::parse("memory:2@node0").unwrap().name(), "memory:2@node0");
        for bad in ["cpu:0", "cpu:1@nowhere", "disk:1", "tlb:1", "memory:1@node4096", "memory:1@x"]
        {
            assert!(Load::parse(bad).unwrap_err().contains(bad), "{bad}");
        }
        assert!(start(&Load::parse("cpu:1@same").unwrap(), None, &cpus()).is_err());
        let e = start(&Load::parse("cpu:1").unwrap(), Some(0), &[0]).unwrap_err();
        assert!(e.contains("core 0 is the only one"), "{e}");
    }
}
