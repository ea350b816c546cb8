//! The plugin contract, `orch:plugin@0.1.0` in `wit/`, bound for the host.
//!
//! Design decision: this is the only crate that runs `wasmtime::component::bindgen!`; every
//! other crate uses the types it generates, so the contract has one Rust face (as Spin's
//! `crates/world`). The trainer world has its own module, [`trainer`], beside [`policy`], and
//! shares [`types`] with it; the queue world, [`queue`], has a vocabulary of its own
//! ([`queue_types`]).

/// The `policy` world: selection policies export `select`.
pub mod policy {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "policy",
    });
}

/// The `trainer` world: trainers import tensors (host resources), autograd, parameters,
/// optimizers, data, devices and metrics, and export `init`, `train-step` and `eval-step`.
/// Imports are trappable: a host function returns `wasmtime::Result`, and an `Err` stops the
/// plugin (a trap), while failures the plugin caused come back as `tensor-error` values.
pub mod trainer {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "trainer",
        imports: { default: trappable },
        with: { "orch:plugin/types": crate::policy::orch::plugin::types },
    });
}

/// The `queue` world: queue policies export `order`, which ranks the daemon's queued jobs.
pub mod queue {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "queue",
    });
}

/// The shared `orch:plugin/types` interface: devices, leases, request, decision, refusal.
pub use policy::orch::plugin::types;
pub use policy::{Policy, PolicyPre};
/// The `orch:plugin/queue-types` interface: queued jobs, tenants, the machine, ranked entries.
pub use queue::orch::plugin::queue_types;
pub use queue::{Queue, QueuePre};

/// The world a policy component implements, as `orch plugin inspect` names it.
pub const POLICY_WORLD: &str = "orch:plugin/policy@0.1.0";

/// The world a queue-policy component implements.
pub const QUEUE_WORLD: &str = "orch:plugin/queue@0.1.0";

/// The world a trainer component implements.
pub const TRAINER_WORLD: &str = "orch:plugin/trainer@0.1.0";

/// The package every orch world belongs to.
pub const PACKAGE: &str = "orch:plugin@0.1.0";
