//! The wasmtime engine every plugin runs in, and the ticker that makes deadlines work.

use crate::limits::Limits;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, UpdateDeadline,
};

/// How often the ticker advances the engine's epoch: the granularity of every deadline.
pub(crate) const TICK: Duration = Duration::from_millis(5);

/// Plugin instances alive at once per host (a warm one per loaded plugin, plus one being made).
pub(crate) const POOL_INSTANCES: u32 = 64;

/// An engine configured for untrusted plugins: epoch interruption on, the stack capped, the
/// component model's concurrency machinery off (policies are plain calls, and a store without
/// it makes a call several times cheaper), and instances allocated from a pool: a fresh
/// instance then reuses a slot (and the pages it kept resident) instead of mapping and
/// unmapping memory, which is most of what making one costs.
pub fn new_engine(limits: &Limits) -> wasmtime::Result<Engine> {
    let mut pool = PoolingAllocationConfig::new();
    let per = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    pool.total_component_instances(POOL_INSTANCES)
        .total_core_instances(POOL_INSTANCES.saturating_mul(8))
        .total_memories(POOL_INSTANCES)
        .total_tables(POOL_INSTANCES.saturating_mul(2))
        .max_core_instances_per_component(per(limits.instances))
        .max_memories_per_component(per(limits.memories))
        .max_tables_per_component(per(limits.tables))
        .table_elements(limits.table_elements)
        // A slot holds any memory a wasm32 plugin can have; each store's limiter applies the
        // plugin's own cap (a job's `memory`, all its memories together).
        .max_memory_size(WASM32_MEMORY)
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(KEEP_RESIDENT)
        // Reset only the pages an instance touched (Linux 6.7+; elsewhere wasmtime falls back).
        .pagemap_scan(Enabled::Auto);
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .concurrency_support(false)
        .epoch_interruption(true)
        .max_wasm_stack(limits.max_wasm_stack)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config)
}

/// The most linear memory a wasm32 plugin can address.
const WASM32_MEMORY: usize = 4 << 30;

/// Bytes of a slot's memory kept mapped between instances.
const KEEP_RESIDENT: usize = 1 << 20;

/// Epoch ticks that make up `deadline` (at least two, so a call never starts already late).
pub fn deadline_ticks(deadline: Duration) -> u64 {
    (deadline.as_nanos().div_ceil(TICK.as_nanos()) as u64).max(2)
}

/// A call's deadline counts the time the plugin ran, not the time it waited for a core.
///
/// The epoch ticker measures wall-clock time. On a loaded machine (fifty `orch run`s starting at
/// once on two cores, say) a plugin that needs 5 ms of work can wait 100 ms for a core, and a
/// wall-clock deadline would stop it for the machine's load, not for anything it did. So when a
/// call's epoch deadline comes, the store asks its clock ([`CallClock::at_deadline`]): the CPU
/// time of the thread that runs the plugin (the call runs on the caller's thread) is compared with
/// the budget, and the call goes on for what is left of it. A plugin that blocks without running
/// (a WASI poll on a clock, say) is stopped by a wall-clock backstop, [`wall_backstop`].
#[derive(Debug, Clone, Copy)]
pub struct CallClock {
    budget: Duration,
    cpu_start: Duration,
    wall_start: Instant,
}

impl CallClock {
    /// A clock that starts now, for a call of `budget`.
    pub fn start(budget: Duration) -> CallClock {
        CallClock {
            budget,
            cpu_start: thread_cpu_time(),
            wall_start: Instant::now(),
        }
    }

    /// What the store does at an epoch deadline: the rest of the budget, in ticks, or the trap.
    pub fn at_deadline(&self) -> UpdateDeadline {
        let ran = thread_cpu_time().saturating_sub(self.cpu_start);
        match extension(self.budget, ran, self.wall_start.elapsed()) {
            Some(ticks) => UpdateDeadline::Continue(ticks),
            None => UpdateDeadline::Interrupt,
        }
    }
}

/// The wall-clock time after which a call of `budget` is stopped whatever it ran: twenty times
/// the budget and a second more (3.0 s for the default 100 ms).
pub fn wall_backstop(budget: Duration) -> Duration {
    budget
        .saturating_mul(20)
        .saturating_add(Duration::from_secs(1))
}

/// Ticks more for a call of `budget` that has run `ran` over `wall`, or `None`: stop it.
fn extension(budget: Duration, ran: Duration, wall: Duration) -> Option<u64> {
    if ran >= budget || wall >= wall_backstop(budget) {
        return None;
    }
    let left = (budget - ran).min(wall_backstop(budget) - wall);
    Some((left.as_nanos().div_ceil(TICK.as_nanos()) as u64).max(1))
}

/// CPU time this thread has used (`CLOCK_THREAD_CPUTIME_ID`); zero where it cannot be read,
/// which leaves the wall-clock backstop as the deadline.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call writes nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// A thread that advances the engine's epoch every [`TICK`] until dropped.
#[derive(Debug)]
pub struct Ticker {
    stop: Arc<AtomicBool>,
}

impl Ticker {
    pub fn start(engine: &Engine) -> std::io::Result<Ticker> {
        let stop = Arc::new(AtomicBool::new(false));
        let engine = engine.clone();
        let flag = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("orch-epoch-ticker".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    engine.increment_epoch();
                }
            })?;
        Ok(Ticker { stop })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        // The thread notices within one tick and ends; nobody needs to wait for it.
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_up_to_whole_ticks() {
        assert_eq!(deadline_ticks(Duration::from_millis(100)), 20);
        assert_eq!(deadline_ticks(Duration::from_millis(101)), 21);
        assert_eq!(deadline_ticks(Duration::from_millis(1)), 2);
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_call_waiting_for_a_core_gets_the_rest_of_its_budget() {
        // 100 ms have passed on the wall, but the plugin ran 10 ms: 90 ms more, in ticks.
        assert_eq!(extension(100 * MS, 10 * MS, 100 * MS), Some(18));
        // A sliver left is still at least a tick.
        assert_eq!(extension(100 * MS, 99 * MS + MS / 2, 100 * MS), Some(1));
    }

    #[test]
    fn a_call_that_ran_its_budget_or_waited_past_the_backstop_stops() {
        assert_eq!(extension(100 * MS, 100 * MS, 100 * MS), None);
        assert_eq!(extension(100 * MS, 250 * MS, 260 * MS), None);
        assert_eq!(wall_backstop(100 * MS), 3000 * MS);
        assert_eq!(extension(100 * MS, Duration::ZERO, 3000 * MS), None);
        // Near the backstop the extension is what is left of it.
        assert_eq!(extension(100 * MS, Duration::ZERO, 2990 * MS), Some(2));
    }

    #[test]
    fn the_thread_clock_counts_work_not_sleep() {
        let start = thread_cpu_time();
        std::thread::sleep(50 * MS);
        let slept = thread_cpu_time() - start;
        let start = thread_cpu_time();
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < 30 * MS {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let worked = thread_cpu_time() - start;
        assert!(slept < 20 * MS, "a sleep of 50 ms counted {slept:?}");
        assert!(
            worked > slept,
            "30 ms of work counted {worked:?}, a sleep {slept:?}"
        );
    }
}
