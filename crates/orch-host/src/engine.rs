//! The wasmtime engine every plugin runs in, and the ticker that makes deadlines work.

use crate::limits::Limits;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

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
}
