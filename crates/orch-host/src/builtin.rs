//! The built-in plugins: the placement policies (`plugins/policies/`) and the queue policies
//! (`plugins/queue/`), Wasm components built by this crate's build script and embedded in the
//! binary. They run in the same sandbox as anyone's plugin.

/// One built-in policy.
#[derive(Debug)]
pub struct Builtin {
    /// The name a job's `[policy] plugin` uses.
    pub name: &'static str,
    /// One line for `orch plugin inspect` and the docs.
    pub summary: &'static str,
    /// The component.
    pub wasm: &'static [u8],
    /// `[policy.config]` keys the host fills in when the job leaves them out.
    pub default_config: &'static [(&'static str, &'static str)],
}

/// Every built-in, in the order the docs list them.
pub static BUILTINS: &[Builtin] = &[
    Builtin {
        name: "least-loaded",
        summary: "lowest utilization, then most free memory",
        wasm: wasm!("least_loaded.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "most-free-memory",
        summary: "most free memory, then lowest utilization",
        wasm: wasm!("most_free_memory.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "pack",
        summary: "best fit: the fullest device that fits, against fragmentation",
        wasm: wasm!("pack.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "spread",
        summary: "fewest jobs on the device (leases and processes), then lowest utilization",
        wasm: wasm!("spread.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "first-fit",
        summary: "lowest CUDA index that fits",
        wasm: wasm!("first_fit.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "explicit",
        summary: "the devices config `devices` lists (\"0,2\", UUIDs or prefixes)",
        wasm: wasm!("explicit.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "env",
        summary: "the devices an environment variable lists (config `var`, default CLOUD_GPU_ID)",
        wasm: wasm!("env.wasm"),
        default_config: &[("var", "CLOUD_GPU_ID")],
    },
];

/// The built-in called `name`.
pub fn builtin(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// The built-in policies' names, for an error message.
pub(crate) fn names() -> Vec<&'static str> {
    BUILTINS.iter().map(|b| b.name).collect()
}

/// The built-in queue policies by name, with a line each for the docs and `orch serve`.
pub const QUEUE_BUILTINS: &[(&str, &str)] = orch_queue::BUILTINS;

/// The component of built-in queue policy `name`.
pub(crate) fn queue_wasm(name: &str) -> Option<&'static [u8]> {
    match name {
        "fair-share" => Some(wasm!("queue_fair_share.wasm")),
        "fifo" => Some(wasm!("queue_fifo.wasm")),
        "priority" => Some(wasm!("queue_priority.wasm")),
        _ => None,
    }
}

/// The built-ins' names, for an error message.
pub(crate) fn queue_names() -> Vec<&'static str> {
    QUEUE_BUILTINS.iter().map(|&(name, _)| name).collect()
}
