//! The queue host: loads queue policies (world `orch:plugin/queue`, built-in or from a file),
//! keeps one warm instance per plugin, asks for the order of the daemon's queue under the
//! limits, and checks every answer.
//!
//! The built-ins (`fair-share`, `fifo`, `priority`) are `plugins/queue/`, thin wrappers around
//! `orch_queue`'s orders, embedded and sandboxed like anyone's plugin; they answer exactly as
//! `orch_queue::builtin(name)` does natively, which is the daemon's fallback when a plugin fails.

use crate::builtin::queue_wasm as builtin_wasm;
use crate::contract::WorldKind;
use crate::error::{PluginError, PluginKind};
use crate::limits::Limits;
use crate::runtime::{Host, World};
use crate::sandbox::PluginState;
use crate::validate::clean_text;
use orch_core::PluginRef;
use orch_queue::{Job, Machine, Ranked, Tenant, check_order, clean_reason_owned};
use orch_wit::queue_types as wit;
use orch_wit::{Queue, QueuePre, Version, v0_1, v0_2, v0_3, v0_4};
use std::path::PathBuf;
use wasmtime::Store;
use wasmtime::component::InstancePre;

/// A loaded queue policy, as [`QueueHost::load`] returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueuePluginId(usize);

/// Runs queue policies. The daemon keeps one: it owns an engine, its epoch ticker, the compiled
/// components and a warm instance of each loaded queue policy.
pub struct QueueHost {
    host: Host<QueueWorld>,
}

impl std::fmt::Debug for QueueHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.host.debug(f, "QueueHost")
    }
}

/// The `queue` world.
pub(crate) struct QueueWorld;

/// A queue policy's bindings, by the version of the contract it implements.
pub(crate) enum AnyQueuePre {
    V0_1(v0_1::queue::QueuePre<PluginState>),
    V0_2(v0_2::queue::QueuePre<PluginState>),
    V0_3(v0_3::queue::QueuePre<PluginState>),
    V0_4(v0_4::queue::QueuePre<PluginState>),
    V0_5(QueuePre<PluginState>),
}

/// A queue policy instance's exports, by version.
pub(crate) enum AnyQueue {
    V0_1(v0_1::queue::Queue),
    V0_2(v0_2::queue::Queue),
    V0_3(v0_3::queue::Queue),
    V0_4(v0_4::queue::Queue),
    V0_5(Queue),
}

impl AnyQueue {
    /// `queue-order.order-jobs` (0.2.0 and later) or `order` (0.1.0): the same call.
    fn order(
        &self,
        store: &mut Store<PluginState>,
        jobs: &[wit::QueuedJob],
        tenants: &[wit::Tenant],
        machine: wit::Machine,
    ) -> wasmtime::Result<Result<Vec<wit::Ranked>, String>> {
        match self {
            AnyQueue::V0_1(queue) => queue.call_order(store, jobs, tenants, machine),
            AnyQueue::V0_2(queue) => queue
                .orch_plugin_queue_order()
                .call_order_jobs(store, jobs, tenants, machine),
            AnyQueue::V0_3(queue) => queue
                .orch_plugin_queue_order()
                .call_order_jobs(store, jobs, tenants, machine),
            AnyQueue::V0_4(queue) => queue
                .orch_plugin_queue_order()
                .call_order_jobs(store, jobs, tenants, machine),
            AnyQueue::V0_5(queue) => queue
                .orch_plugin_queue_order()
                .call_order_jobs(store, jobs, tenants, machine),
        }
    }
}

impl World for QueueWorld {
    const KIND: PluginKind = PluginKind::Queue;
    const WORLD: WorldKind = WorldKind::Queue;
    type State = PluginState;
    type Pre = AnyQueuePre;
    type Exports = AnyQueue;
    type Extra = ();

    fn builtin(name: &str) -> Option<(&'static [u8], ())> {
        builtin_wasm(name).map(|wasm| (wasm, ()))
    }

    fn pre(pre: InstancePre<PluginState>, version: Version) -> wasmtime::Result<AnyQueuePre> {
        Ok(match version {
            Version::V0_1 => AnyQueuePre::V0_1(v0_1::queue::QueuePre::new(pre)?),
            Version::V0_2 => AnyQueuePre::V0_2(v0_2::queue::QueuePre::new(pre)?),
            Version::V0_3 => AnyQueuePre::V0_3(v0_3::queue::QueuePre::new(pre)?),
            Version::V0_4 => AnyQueuePre::V0_4(v0_4::queue::QueuePre::new(pre)?),
            Version::V0_5 => AnyQueuePre::V0_5(QueuePre::new(pre)?),
        })
    }

    fn instantiate(
        pre: &AnyQueuePre,
        store: &mut Store<PluginState>,
    ) -> wasmtime::Result<AnyQueue> {
        Ok(match pre {
            AnyQueuePre::V0_1(pre) => AnyQueue::V0_1(pre.instantiate(store)?),
            AnyQueuePre::V0_2(pre) => AnyQueue::V0_2(pre.instantiate(store)?),
            AnyQueuePre::V0_3(pre) => AnyQueue::V0_3(pre.instantiate(store)?),
            AnyQueuePre::V0_4(pre) => AnyQueue::V0_4(pre.instantiate(store)?),
            AnyQueuePre::V0_5(pre) => AnyQueue::V0_5(pre.instantiate(store)?),
        })
    }
}

impl QueueHost {
    /// A host with `limits` ([`Limits::queue_default`] is what the daemon wants), caching
    /// compiled components under [`default_cache_dir`].
    ///
    /// [`default_cache_dir`]: crate::default_cache_dir
    pub fn new(limits: Limits) -> Result<QueueHost, PluginError> {
        QueueHost::with_cache_dir(limits, crate::default_cache_dir())
    }

    /// A host caching compiled components under `cache_dir` (`None`: in memory only).
    pub fn with_cache_dir(
        limits: Limits,
        cache_dir: Option<PathBuf>,
    ) -> Result<QueueHost, PluginError> {
        let host = Host::new(limits, cache_dir)?;
        Ok(QueueHost { host })
    }

    pub fn limits(&self) -> &Limits {
        self.host.limits()
    }

    /// Loads a built-in by name (`fair-share`, `fifo`, `priority`) or a component from a file,
    /// once: later calls return the same plugin.
    pub fn load(&mut self, plugin: &PluginRef) -> Result<QueuePluginId, PluginError> {
        let limits = *self.host.limits();
        self.host.load(plugin, &limits).map(QueuePluginId)
    }

    /// Loads a component from bytes under `name` (the name every error uses).
    pub fn load_bytes(&mut self, name: &str, wasm: &[u8]) -> Result<QueuePluginId, PluginError> {
        let limits = *self.host.limits();
        self.host.load_bytes(name, wasm, &limits).map(QueuePluginId)
    }

    /// The version of the contract the plugin implements.
    pub fn version(&self, id: QueuePluginId) -> Version {
        self.host.version(id.0)
    }

    /// The name errors use for the plugin (a built-in's name, a file's name).
    pub fn name(&self, id: QueuePluginId) -> &str {
        self.host.name(id.0)
    }

    /// Drops the plugin's warm instance: the next call instantiates afresh.
    pub fn discard_instance(&mut self, id: QueuePluginId) {
        self.host.discard(id.0);
    }

    /// Asks plugin `id` for the order in which to try `jobs` (a job's `tenant` indexes
    /// `tenants`), within the limits. The answer is checked ([`check_order`]: only jobs offered,
    /// each at most once) and its reasons cleaned ([`orch_queue::clean_reason`]). A plugin that traps,
    /// overruns or answers wrongly loses its instance, and the error is one sentence naming it
    /// and the fault; one that answers with an error value keeps it
    /// ([`PluginError::QueueRefused`]).
    pub fn order(
        &mut self,
        id: QueuePluginId,
        jobs: &[Job],
        tenants: &[Tenant],
        machine: &Machine,
    ) -> Result<Vec<Ranked>, PluginError> {
        let offered: Vec<wit::QueuedJob> = jobs.iter().map(wit_job).collect();
        let tenants: Vec<wit::Tenant> = tenants.iter().map(wit_tenant).collect();
        let machine = wit::Machine {
            free_gpus: machine.free_gpus,
            total_gpus: machine.total_gpus,
        };
        let (answer, warm) = self.host.call(id.0, |queue, store| {
            queue.order(store, &offered, &tenants, machine)
        })?;
        let plugin = || self.host.name(id.0).to_string();
        let ranked: Vec<Ranked> = match answer {
            Err(message) => {
                let error = PluginError::QueueRefused {
                    plugin: plugin(),
                    message: clean_text(&message),
                };
                self.host.keep(id.0, warm);
                return Err(error);
            }
            Ok(ranked) => ranked
                .into_iter()
                .map(|r| Ranked {
                    job: r.job,
                    reason: clean_reason_owned(r.reason),
                })
                .collect(),
        };
        check_order(jobs, &ranked).map_err(|problem| PluginError::WrongAnswer {
            kind: PluginKind::Queue,
            plugin: plugin(),
            problem,
        })?;
        self.host.keep(id.0, warm);
        Ok(ranked)
    }
}

fn wit_job(job: &Job) -> wit::QueuedJob {
    wit::QueuedJob {
        id: job.id,
        tenant: job.tenant,
        name: job.name.clone(),
        tags: job.tags.clone(),
        gpus: job.gpus,
        priority: job.priority,
        age_s: job.age_s,
        runtime_s: job.runtime_s,
        preemptible: job.preemptible,
    }
}

fn wit_tenant(tenant: &Tenant) -> wit::Tenant {
    wit::Tenant {
        name: tenant.name.clone(),
        share: tenant.share,
        normalized_share: tenant.normalized_share,
        usage_gpu_s: tenant.usage_gpu_s,
        normalized_usage: tenant.normalized_usage,
        fair_share: tenant.fair_share,
        gpus_held: tenant.gpus_held,
        max_gpus: tenant.max_gpus,
        queued: tenant.queued,
        running: tenant.running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_embedded() {
        for name in crate::builtin::queue_names() {
            assert!(orch_queue::builtin(name).is_some(), "{name}");
            let wasm = builtin_wasm(name).unwrap_or_default();
            assert!(wasm.starts_with(b"\0asm"), "{name} is embedded");
        }
        assert!(builtin_wasm("fastest").is_none());
    }

    /// The daemon makes its host in one thread and hands it to its engine thread.
    #[test]
    fn the_host_can_move_to_another_thread() {
        fn send<T: Send>() {}
        send::<QueueHost>();
    }
}
