//! What orch's built-in queue policies share: the `queue` world's guest bindings (generated
//! once, here, and exported by each policy with [`export_order!`]) and the conversions between
//! its records and `orch-queue`'s types.
//!
//! Design decision: a built-in queue policy is one of `orch_queue`'s orders run inside the
//! sandbox. [`run`] moves the records into `orch_queue`'s types (the strings are moved, not
//! copied), calls the order and moves the answer back, so the Wasm built-ins and the host's
//! native fallback answer with the very same code.

// The generated export macro names paths through this crate, from inside it too.
extern crate self as orch_queue_kit;

/// The guest bindings of the `queue` world, in a module: `#[macro_export]` puts the export
/// macro at the crate root, where it would clash with the bindings' own re-exports.
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "queue",
        pub_export_macro: true,
        export_macro_name: "export_queue",
        default_bindings_module: "orch_queue_kit::bindings",
        runtime_path: "orch_queue_kit::wit_bindgen::rt",
    });
}

pub use bindings::export_queue;
pub use bindings::exports::orch::plugin::queue_order::Guest;
pub use bindings::orch::plugin::queue_types::{Machine, QueuedJob, Ranked, Tenant};
pub use orch_queue::{self, Order};
pub use wit_bindgen;

/// Exports `queue-order.order-jobs` from a plugin crate: `export_order!(orch_queue::fifo)` runs one of
/// `orch_queue`'s orders (through [`run`]); `export_order!(|jobs, tenants, machine| body)`
/// answers with `body`, a `Result<Vec<Ranked>, String>` (the hostile fixtures).
#[macro_export]
macro_rules! export_order {
    (|$jobs:pat_param, $tenants:pat_param, $machine:pat_param| $body:expr) => {
        struct Plugin;

        impl $crate::Guest for Plugin {
            fn order_jobs(
                $jobs: Vec<$crate::QueuedJob>,
                $tenants: Vec<$crate::Tenant>,
                $machine: $crate::Machine,
            ) -> Result<Vec<$crate::Ranked>, String> {
                $body
            }
        }

        $crate::export_queue!(Plugin);
    };
    ($order:path) => {
        $crate::export_order!(|jobs, tenants, machine| Ok($crate::run(
            $order, jobs, tenants, machine
        )));
    };
}

/// Runs `order` on the call's arguments and answers with its ranking.
pub fn run(
    order: Order,
    jobs: Vec<QueuedJob>,
    tenants: Vec<Tenant>,
    machine: Machine,
) -> Vec<Ranked> {
    let jobs: Vec<orch_queue::Job> = jobs.into_iter().map(job).collect();
    let tenants: Vec<orch_queue::Tenant> = tenants.into_iter().map(tenant).collect();
    let machine = orch_queue::Machine {
        free_gpus: machine.free_gpus,
        total_gpus: machine.total_gpus,
    };
    order(&jobs, &tenants, &machine)
        .into_iter()
        .map(|r| Ranked {
            job: r.job,
            reason: r.reason,
        })
        .collect()
}

/// A queued job as `orch_queue` has it.
pub fn job(j: QueuedJob) -> orch_queue::Job {
    orch_queue::Job {
        id: j.id,
        tenant: j.tenant,
        name: j.name,
        tags: j.tags,
        gpus: j.gpus,
        priority: j.priority,
        age_s: j.age_s,
        runtime_s: j.runtime_s,
        preemptible: j.preemptible,
    }
}

/// A tenant as `orch_queue` has it.
pub fn tenant(t: Tenant) -> orch_queue::Tenant {
    orch_queue::Tenant {
        name: t.name,
        share: t.share,
        normalized_share: t.normalized_share,
        usage_gpu_s: t.usage_gpu_s,
        normalized_usage: t.normalized_usage,
        fair_share: t.fair_share,
        gpus_held: t.gpus_held,
        max_gpus: t.max_gpus,
        queued: t.queued,
        running: t.running,
    }
}
