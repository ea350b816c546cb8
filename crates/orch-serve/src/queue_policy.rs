//! The queue policy a config names, made ready for the scheduler: a built-in or a queue
//! component from a file, each run in the plugin sandbox, or a built-in computed natively (the
//! simulator's fast path: the same `orch-queue` code the built-in components are built from).

use crate::config::Config;
use crate::sched::{NativePolicy, QueuePolicy};
use orch_core::PluginRef;

/// The policy the daemon runs.
pub fn for_daemon(config: &Config) -> Result<Box<dyn QueuePolicy>, String> {
    load(&config.queue_policy)
}

/// The policy the simulator runs: built-ins natively, a file in the sandbox.
pub fn for_simulator(config: &Config) -> Result<Box<dyn QueuePolicy>, String> {
    match &config.queue_policy {
        PluginRef::Builtin(name) => native(name),
        plugin => load(plugin),
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

fn load(plugin: &PluginRef) -> Result<Box<dyn QueuePolicy>, String> {
    match plugin {
        PluginRef::Builtin(name) => native(name),
        PluginRef::Path(path) => Err(format!(
            "queue_policy = \"{}\": queue components are not loaded yet",
            path.display()
        )),
    }
}
