//! The plugin contract, `orch:plugin@0.5.0` in `wit/`, bound for the host, and the contracts
//! it replaced, `orch:plugin@0.4.0`, `@0.3.0`, `@0.2.0` and `@0.1.0` (kept in `compat/`), so
//! plugins built for them keep loading.
//!
//! Design decision: this is the only crate that runs `wasmtime::component::bindgen!`; every
//! other crate uses the types it generates, so the contract has one Rust face (as Spin's
//! `crates/world`). The trainer world has its own module, [`trainer`], beside [`policy`], and
//! shares [`types`] with it; the queue world, [`queue`], has a vocabulary of its own
//! ([`queue_types`]).
//!
//! 0.2.0 changed only where the exports live (each world exports one named interface instead of
//! bare functions, whose names clashed with libc's in guests that link one); every type and
//! every import is the same, field for field. So the 0.1.0 bindings ([`v0_1`]) reuse the 0.2.0
//! Rust types (the component model checks types by structure, not by name), and a 0.1.0
//! trainer's imports are the 0.2.0 host functions linked under the 0.1.0 names.
//!
//! 0.3.0 only added: new functions in `tensors`, `params` and `optim` (the types 0.2.0 had
//! are unchanged, field for field and case for case), the `inference` interface a trainer may
//! export (world `predicting-trainer`), and nothing in the policy and queue worlds but the
//! version. So a 0.2.0 component is bound with [`v0_2`], whose imports are the 0.3.0 host
//! functions linked under the 0.2.0 names (a 0.2.0 component imports a subset of them).
//!
//! 0.4.0 only added to the policy world: `select-devices` takes a fourth argument, the
//! candidates' `topology` (NUMA nodes, links), whose types are new in `types`; every type 0.3.0
//! had is unchanged, and the queue and trainer worlds differ only in the version. So the 0.3.0
//! bindings ([`v0_3`]) reuse the 0.4.0 types and host functions, and a 0.3.0 policy is asked
//! without the topology.
//!
//! 0.5.0 changed the policy world's `topology`: a `slices` list says which candidates are MIG
//! slices (a new `slice` record). The queue and trainer worlds differ only in the version. So
//! [`v0_4`] binds its queue and trainer worlds over the 0.5.0 types, and its policy world over
//! types of its own (the 0.4.0 `topology`), which the host fills from the 0.5.0 ones.

/// The `policy` world: selection policies export `placement.select-devices`.
pub mod policy {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "policy",
    });
}

/// The `trainer` world: trainers import tensors (host resources), autograd, parameters,
/// optimizers, data, devices and metrics, and export `training` (`init-replica`, `train-step`,
/// `eval-step`). Imports are trappable: a host function returns `wasmtime::Result`, and an
/// `Err` stops the plugin (a trap), while failures the plugin caused come back as
/// `tensor-error` values.
pub mod trainer {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "trainer",
        imports: { default: trappable },
        with: { "orch:plugin/types": crate::policy::orch::plugin::types },
    });
}

/// The `queue` world: queue policies export `queue-order.order-jobs`, which ranks the daemon's
/// queued jobs.
pub mod queue {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "queue",
    });
}

/// The `predicting-trainer` world: a trainer that also exports `inference.predict`. Its
/// imports are [`trainer`]'s; only the export is bound here.
pub mod predicting {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "predicting-trainer",
        imports: { default: trappable },
        with: {
            "orch:plugin/types": crate::policy::orch::plugin::types,
            "orch:plugin/tensors": crate::trainer::orch::plugin::tensors,
            "orch:plugin/autograd": crate::trainer::orch::plugin::autograd,
            "orch:plugin/params": crate::trainer::orch::plugin::params,
            "orch:plugin/optim": crate::trainer::orch::plugin::optim,
            "orch:plugin/data": crate::trainer::orch::plugin::data,
            "orch:plugin/devices": crate::trainer::orch::plugin::devices,
            "orch:plugin/metrics": crate::trainer::orch::plugin::metrics,
        },
    });
}

/// The bindings of a trainer world of an older contract (`path`, `world`): its imports are the
/// current interfaces', linked under the older version's names.
/// The queue world of an older contract, over today's queue types (unchanged since 0.1.0).
macro_rules! older_queue {
    ($path:literal) => {
        wasmtime::component::bindgen!({
            path: $path,
            world: "queue",
            with: { "orch:plugin/queue-types": crate::queue_types },
        });
    };
}

macro_rules! older_trainer {
    ($path:literal, $world:literal) => {
        wasmtime::component::bindgen!({
            path: $path,
            world: $world,
            imports: { default: trappable },
            with: {
                "orch:plugin/types": crate::types,
                "orch:plugin/tensors": crate::trainer::orch::plugin::tensors,
                "orch:plugin/autograd": crate::trainer::orch::plugin::autograd,
                "orch:plugin/params": crate::trainer::orch::plugin::params,
                "orch:plugin/optim": crate::trainer::orch::plugin::optim,
                "orch:plugin/data": crate::trainer::orch::plugin::data,
                "orch:plugin/devices": crate::trainer::orch::plugin::devices,
                "orch:plugin/metrics": crate::trainer::orch::plugin::metrics,
            },
        });
    };
}

/// The worlds of `orch:plugin@0.4.0`. 0.5.0 changed one type, `topology` (its `slices`, which
/// MIG slices the candidates are), and nothing else: the queue and trainer worlds are bound
/// over the 0.5.0 types and interfaces (the same ones, as far as they use them), while the
/// policy world has types of its own ([`v0_4::policy`]'s `types`), which the host fills from
/// the 0.5.0 ones.
pub mod v0_4 {
    /// `placement.select-devices` with the 0.4.0 `topology` (no slices).
    pub mod policy {
        wasmtime::component::bindgen!({
            path: "compat/0.4.0",
            world: "policy",
        });
    }

    /// `queue-order.order-jobs`.
    pub mod queue {
        older_queue!("compat/0.4.0");
    }

    /// `training`: the imports are the 0.5.0 interfaces'; link them under the 0.4.0 names.
    pub mod trainer {
        older_trainer!("compat/0.4.0", "trainer");
    }

    /// `predicting-trainer` of 0.4.0: only the `inference` export is bound here.
    pub mod predicting {
        older_trainer!("compat/0.4.0", "predicting-trainer");
    }
}

/// The worlds of `orch:plugin@0.3.0`, over the 0.5.0 types and interfaces (the same ones as
/// far as they use them).
pub mod v0_3 {
    /// `placement.select-devices`, without the topology.
    pub mod policy {
        wasmtime::component::bindgen!({
            path: "compat/0.3.0",
            world: "policy",
            with: { "orch:plugin/types": crate::types },
        });
    }

    /// `queue-order.order-jobs`.
    pub mod queue {
        older_queue!("compat/0.3.0");
    }

    /// `training`: the imports are the 0.4.0 interfaces'; link them under the 0.3.0 names.
    pub mod trainer {
        older_trainer!("compat/0.3.0", "trainer");
    }

    /// `predicting-trainer` of 0.3.0: only the `inference` export is bound here.
    pub mod predicting {
        older_trainer!("compat/0.3.0", "predicting-trainer");
    }
}

/// The worlds of `orch:plugin@0.2.0`, over the 0.3.0 types (the same ones).
pub mod v0_2 {
    /// `placement.select-devices`.
    pub mod policy {
        wasmtime::component::bindgen!({
            path: "compat/0.2.0",
            world: "policy",
            with: { "orch:plugin/types": crate::types },
        });
    }

    /// `queue-order.order-jobs`.
    pub mod queue {
        older_queue!("compat/0.2.0");
    }

    /// `training`: the imports are the 0.3.0 interfaces'; link them under the 0.2.0 names.
    pub mod trainer {
        older_trainer!("compat/0.2.0", "trainer");
    }
}

/// The worlds of `orch:plugin@0.1.0`, whose exports were bare functions (`select`, `order`,
/// `init`, `train-step`, `eval-step`), over the 0.2.0 types.
pub mod v0_1 {
    /// `select`.
    pub mod policy {
        wasmtime::component::bindgen!({
            path: "compat/0.1.0",
            world: "policy",
            with: { "orch:plugin/types": crate::types },
        });
    }

    /// `order`.
    pub mod queue {
        older_queue!("compat/0.1.0");
    }

    /// `init`, `train-step`, `eval-step`. The imports are the 0.2.0 interfaces'; link them
    /// under [`TRAINER_IMPORTS`] with each interface's `add_to_linker_instance`.
    pub mod trainer {
        older_trainer!("compat/0.1.0", "trainer");
    }
}

/// The shared `orch:plugin/types` interface: devices, leases, request, decision, refusal.
pub use policy::orch::plugin::types;
pub use policy::{Policy, PolicyPre};
/// The `orch:plugin/queue-types` interface: queued jobs, tenants, the machine, ranked entries.
pub use queue::orch::plugin::queue_types;
pub use queue::{Queue, QueuePre};

/// A version of the contract, as a component implements it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// `orch:plugin@0.1.0`: bare exports. Still loaded.
    V0_1,
    /// `orch:plugin@0.2.0`: every export in a named interface. Still loaded.
    V0_2,
    /// `orch:plugin@0.3.0`: 0.2.0 and the ops CNNs and transformers need, parameter groups,
    /// clipping, buffers, `predict`. Still loaded.
    V0_3,
    /// `orch:plugin@0.4.0`: 0.3.0 and the candidates' topology (NUMA nodes, links) for a
    /// policy. Still loaded.
    V0_4,
    /// `orch:plugin@0.5.0`: 0.4.0 and, in the topology, which candidates are MIG slices (their
    /// profile, memory, parent, NUMA node, share of the GPU). What `wit/` holds.
    V0_5,
}

impl Version {
    /// The contract of `wit/`.
    pub const CURRENT: Version = Version::V0_5;

    /// `0.5.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_1 => "0.1.0",
            Version::V0_2 => "0.2.0",
            Version::V0_3 => "0.3.0",
            Version::V0_4 => "0.4.0",
            Version::V0_5 => "0.5.0",
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The world a policy component implements (the current contract).
pub const POLICY_WORLD: &str = "orch:plugin/policy@0.5.0";

/// The world a queue-policy component implements.
pub const QUEUE_WORLD: &str = "orch:plugin/queue@0.5.0";

/// The package every orch world belongs to.
pub const PACKAGE: &str = "orch:plugin@0.5.0";
