//! The CPU threads a trainer replica computes with: a rayon pool of its own, and, while a replica
//! that computes on the host runs, its other threads kept looking for work.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `f` (a replica) inside `pool` with the pool's other threads kept looking for work
/// meanwhile, instead of going to sleep between ops: a step of a small model is hundreds of
/// parallel ops tens of microseconds apart, and waking a sleeping worker for each (a futex wake,
/// a context switch) was a tenth of the step's CPU time (perf, the GPT example on 2 threads).
/// OpenMP's threads, which PyTorch computes with, spin the same way between parallel regions.
/// For replicas that compute on the host: a CUDA replica's threads have nothing to pick up.
pub(crate) fn install_warm<R: Send>(pool: &rayon::ThreadPool, f: impl FnOnce() -> R + Send) -> R {
    let warm = KeepWarm::start(pool);
    pool.install(|| {
        let _mark = ReplicaMark::set();
        warm.started.store(true, Ordering::Release);
        f()
    })
}

thread_local! {
    /// Set on the pool thread that runs the replica itself.
    static REPLICA_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as the replica's while alive.
struct ReplicaMark;

impl ReplicaMark {
    fn set() -> ReplicaMark {
        REPLICA_THREAD.set(true);
        ReplicaMark
    }
}

impl Drop for ReplicaMark {
    fn drop(&mut self) {
        REPLICA_THREAD.set(false);
    }
}

/// One spinning task on each thread of a pool but one, until dropped.
struct KeepWarm {
    /// The replica runs: the tasks may take work from now on.
    started: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl KeepWarm {
    /// Called from outside `pool`, before the replica is installed in it: the tasks go to the
    /// pool's queue first (first in, first out), so each takes a thread of its own and the
    /// replica the last one.
    fn start(pool: &rayon::ThreadPool) -> KeepWarm {
        let started = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        for _ in 1..pool.current_num_threads() {
            let (started, stop) = (Arc::clone(&started), Arc::clone(&stop));
            pool.spawn(move || {
                // Should the replica's own thread pick the task up while it waits inside a
                // join, it must not spin there (the join could never return).
                if REPLICA_THREAD.get() {
                    return;
                }
                // Nothing is taken before the replica runs: the replica itself is a job of
                // the pool's queue until then, and a task that took it would run it on its own
                // thread instead of leaving it to another.
                while !started.load(Ordering::Acquire) && !stop.load(Ordering::Relaxed) {
                    std::thread::yield_now();
                }
                let mut idle = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                        idle = 0;
                        continue;
                    }
                    // Past a short spin, the core is offered to any other thread that wants
                    // it at each look (the thread stays runnable, so work is still picked up
                    // within microseconds): a machine with more threads than cores loses
                    // little to the spinning.
                    idle = idle.saturating_add(1);
                    if idle < 256 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            });
        }
        KeepWarm { started, stop }
    }
}

impl Drop for KeepWarm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The CPU threads replica `rank` computes with: a rayon pool of its own, its share of the
/// machine's cores (`RAYON_NUM_THREADS` when set), which the replica runs inside. Inside the pool
/// an op's parallel loops start on the calling thread; called from outside, every op would hand
/// its work to the pool and put the caller to sleep until woken, which cost about a quarter of a
/// small model's CPU step. Replicas never share a pool: a worker that stole another replica's
/// work while that one waits in an all-reduce would stall both. `None`: the threads could not
/// be started, and the replica computes on rayon's global pool instead.
pub(crate) fn replica_pool(rank: usize, replicas: usize) -> Option<rayon::ThreadPool> {
    let cores = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1);
    let threads = (cores / replicas.max(1)).max(1);
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("orch-replica-{rank}-cpu-{i}"))
        .build()
    {
        Ok(pool) => Some(pool),
        Err(e) => {
            tracing::debug!(
                "replica {rank}: no thread pool of its own ({e}); using the global one"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// CPU time (user and system, in clock ticks) of this process's threads named `prefix*`.
    fn cpu_ticks_of(prefix: &str) -> u64 {
        let mut ticks = 0;
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if !comm.starts_with(prefix) {
                continue;
            }
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // Fields after the command's closing parenthesis: state is the 3rd field, utime
            // the 14th and stime the 15th.
            let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
            let fields: Vec<&str> = rest.split(' ').collect();
            ticks +=
                fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        }
        ticks
    }

    /// A replica's pool with its other threads kept warm: they spin while the replica runs (it
    /// gets every join and parallel loop to the right answer), and stop when it ends: the
    /// pool's threads then use no CPU.
    #[test]
    fn a_warm_pool_computes_and_stops_spinning_with_the_replica() {
        for threads in [2, 3] {
            let prefix = format!("warm{threads}-");
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name({
                    let prefix = prefix.clone();
                    move |i| format!("{prefix}{i}")
                })
                .build()
                .unwrap();
            let (sum, warm_ticks) = install_warm(&pool, || {
                // Watched until they have used a little CPU, for at most 5 s: a busy machine
                // may give spinning threads none for a while.
                let before = cpu_ticks_of(&prefix);
                let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
                let mut warm_ticks = 0;
                while warm_ticks < 2 && std::time::Instant::now() < give_up {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    warm_ticks = cpu_ticks_of(&prefix) - before;
                }
                let sum = (0..2000u64)
                    .map(|i| {
                        let (a, b) = rayon::join(|| i, || i + 1);
                        let c: u64 = (0..(i % 64)).into_par_iter().sum();
                        a + b + c
                    })
                    .sum::<u64>();
                (sum, warm_ticks)
            });
            // While the replica slept, the other threads kept looking for work (on a quiet
            // machine about 10 ticks a thread in 100 ms; on a busy one they yield most of it).
            assert!(
                warm_ticks >= 2,
                "{threads} threads: the pool used {warm_ticks} ticks while the replica ran"
            );
            let expected: u64 = (0..2000u64)
                .map(|i| 2 * i + 1 + (i % 64) * (i % 64).saturating_sub(1) / 2)
                .sum();
            assert_eq!(sum, expected, "{threads} threads");
            std::thread::sleep(std::time::Duration::from_millis(100));
            let before = cpu_ticks_of(&prefix);
            std::thread::sleep(std::time::Duration::from_millis(500));
            let spent = cpu_ticks_of(&prefix) - before;
            // A thread still spinning would take most of the half second (about 50 ticks).
            assert!(
                spent <= 5,
                "{threads} threads: the pool used {spent} ticks of CPU after the replica ended"
            );
        }
    }
}
