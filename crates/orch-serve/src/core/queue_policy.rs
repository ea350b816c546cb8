//! The queue policy a config names, made ready for the scheduler: a built-in or a queue
//! component from a file, each run in the plugin sandbox (the daemon), or a built-in computed
//! natively (the simulator's fast path: the same `orch-queue` code the built-in components are
//! built from, and orch-host's tests check that both give the same order).

use crate::core::config::Config;
use crate::core::sched::{NativePolicy, QueuePolicy};
use orch_core::limits::PluginKind as LimitKind;
use orch_core::{MachineLimits, PluginRef};
use orch_host::{Limits, QueueHost, QueuePluginId};

/// The policy the daemon runs.
pub fn for_daemon(config: &Config) -> Result<Box<dyn QueuePolicy>, String> {
    load(config)
}

/// The policy the simulator runs: built-ins natively, a file in the sandbox.
pub fn for_simulator(config: &Config) -> Result<Box<dyn QueuePolicy>, String> {
    match &config.queue_policy {
        PluginRef::Builtin(name) => native(name),
        _ => load(config),
    }
}

fn native(name: &str) -> Result<Box<dyn QueuePolicy>, String> {
    NativePolicy::new(name)
        .map(|p| Box::new(p) as Box<dyn QueuePolicy>)
        .ok_or_else(|| unknown(name))
}

fn unknown(name: &str) -> String {
    let names: Vec<&str> = orch_queue::BUILTINS.iter().map(|(n, _)| *n).collect();
    format!(
        "queue_policy = \"{name}\" is not a built-in queue policy (built-ins: {})",
        names.join(", ")
    )
}

/// The config's queue component, under `[queue] deadline` and `memory` within the machine's
/// maxima. A component that cannot be loaded (a missing file, not a queue component) is an error
/// at `queue_policy`'s place in the config.
fn load(config: &Config) -> Result<Box<dyn QueuePolicy>, String> {
    let bounds = MachineLimits::current()
        .and_then(|machine| machine.resolve(LimitKind::Queue, &config.queue_limits))
        .map_err(|e| e.to_string())?;
    let limits = Limits::queue_default().with_bounds(bounds);
    let mut host = QueueHost::new(limits).map_err(|e| e.to_string())?;
    let id = host
        .load(&config.queue_policy)
        .map_err(|e| match &config.queue_policy_at {
            Some(at) => format!("{at}: {e}"),
            None => e.to_string(),
        })?;
    let name = host.name(id).to_string();
    Ok(Box::new(WasmQueuePolicy { host, id, name }))
}

/// A queue component (built-in or from a file) in the plugin sandbox.
#[derive(Debug)]
pub struct WasmQueuePolicy {
    host: QueueHost,
    id: QueuePluginId,
    name: String,
}

impl QueuePolicy for WasmQueuePolicy {
    fn name(&self) -> &str {
        &self.name
    }

    fn order(
        &mut self,
        jobs: &[orch_queue::Job],
        tenants: &[orch_queue::Tenant],
        machine: &orch_queue::Machine,
    ) -> Result<Vec<orch_queue::Ranked>, String> {
        self.host
            .order(self.id, jobs, tenants, machine)
            .map_err(|e| e.to_string())
    }
}
